/* optim.c: the checks of a ur_optim_config, one for the dense optimizers (dense/optim.c) and the
 * embedding tables' fused one (embedding/table.c); the arithmetic is core/optim_plan.h's. */
#include <math.h>
#include "core/core.h"
#include "core/optim_plan.h"

size_t ur_sizeof_optim_config(void) { return sizeof(ur_optim_config); }

ur_status ur__optim_check(const char *who, const ur_optim_config *c, int tables) {
  if (!c) return ur__error(UR_STATUS_INVALID, "%s: the optimizer settings are missing (NULL)", who);
  int k = c->kind;
  int ok = tables ? k == UR_OPTIM_KIND_SGD || k == UR_OPTIM_KIND_ROWWISE_ADAGRAD ||
                        k == UR_OPTIM_KIND_ADAGRAD || k == UR_OPTIM_KIND_ADAM
                  : k == UR_OPTIM_KIND_SGD || k == UR_OPTIM_KIND_ADAGRAD ||
                        k == UR_OPTIM_KIND_ADAM || k == UR_OPTIM_KIND_ADAMW;
  if (!ok)
    return ur__error(UR_STATUS_INVALID, "%s: optimizer kind %d is not one %s takes (%s)", who, k,
                     tables ? "embedding tables" : "dense parameters",
                     tables ? "UR_OPTIM_KIND_SGD, _ROWWISE_ADAGRAD, _ADAGRAD or _ADAM"
                            : "UR_OPTIM_KIND_SGD, _ADAGRAD, _ADAM or _ADAMW");
  if (!(isfinite(c->lr) && c->lr >= 0))
    return ur__error(UR_STATUS_INVALID, "%s: lr %g; expected a finite value >= 0", who, c->lr);
  if (!(isfinite(c->weight_decay) && c->weight_decay >= 0))
    return ur__error(UR_STATUS_INVALID, "%s: weight_decay %g; expected a finite value >= 0", who,
                     c->weight_decay);
  if (!(isfinite(c->max_grad) && c->max_grad >= 0))
    return ur__error(UR_STATUS_INVALID,
                     "%s: max_grad %g; expected a finite value >= 0 (0: no clipping)", who,
                     c->max_grad);
  if (!(isfinite(c->clip_norm) && c->clip_norm >= 0))
    return ur__error(UR_STATUS_INVALID,
                     "%s: clip_norm %g; expected a finite value >= 0 (0: no clipping)", who,
                     c->clip_norm);
  if (tables && c->clip_norm != 0)
    return ur__error(UR_STATUS_INVALID, "%s: clip_norm %g; the tables take none (it clips the "
                     "dense gradients; max_grad clips the tables')", who, c->clip_norm);
  if (k == UR_OPTIM_KIND_SGD && !(isfinite(c->momentum) && c->momentum >= 0))
    return ur__error(UR_STATUS_INVALID, "%s: momentum %g; expected a finite value >= 0", who,
                     c->momentum);
  if (k == UR_OPTIM_KIND_SGD && c->nesterov && !(c->momentum > 0))
    return ur__error(UR_STATUS_INVALID, "%s: nesterov needs momentum > 0", who);
  if (k != UR_OPTIM_KIND_SGD && !(isfinite(c->eps) && c->eps > 0))
    return ur__error(UR_STATUS_INVALID, "%s: eps %g; expected a finite value > 0", who, c->eps);
  if ((k == UR_OPTIM_KIND_ADAM || k == UR_OPTIM_KIND_ADAMW) &&
      !(c->beta1 >= 0 && c->beta1 < 1 && c->beta2 >= 0 && c->beta2 < 1))
    return ur__error(UR_STATUS_INVALID, "%s: Adam betas %g, %g; expected each in [0, 1)", who,
                     c->beta1, c->beta2);
  return UR_STATUS_OK;
}
