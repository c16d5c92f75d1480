-- `uvmrec export`: a training checkpoint of DLRM (a file, or a run directory's newest) to one
-- model file for serving: the description, the dense weights, each table's rows in a serving
-- format (per-row f16 scale and bias for int8/int4/int2), each table's id mapping and where the
-- training run's held-out samples were (docs/serving.md).  It prints each table's quantization
-- error.  Its options are declared below (`uvmrec export --help`).
local export = require "uvmrec.serve.export"

local FORMATS = { "f32", "fp16", "int8", "int4", "int2" }
local cmd = require("uvmrec.cli").command {
  name = "export",
  summary = "export a training checkpoint as a model file for serving, tables quantized (fp16, int8, int4, int2)",
  { "CHECKPOINT", "a checkpoint file, or a run directory (its newest checkpoint)" },
  { "--out FILE", "the model file to write (safetensors, metadata uvmrec.format=model)", required = true },
  { "--tables FORMAT", "the format of every table's rows", choices = FORMATS, default = "int8" },
  { "--per-table LIST", "formats of single tables, e.g. C3=int4,C12=fp16", check = export.parse_per_table },
  { "--dense DTYPE", "the dense weights' dtype (the compute dtype when serving)", choices = { "f32", "bf16" },
    default = "f32" },
  { "--chunk SIZE", "a table's rows read, quantized and written at a time (bytes, or e.g. 16MiB): the host "
    .. "memory export holds", check = require("uvmrec.lib").bytes, default = export.CHUNK },
}
local o = cmd:parse(arg)
-- SIGINT and SIGTERM stop it between blocks of rows (cmd:catch_signals): the model file is
-- abandoned, its temporary file removed.  A second signal, or SIGKILL, ends the process at once:
-- that leaves FILE.tmp-XXXXXX, never FILE.
local signals = cmd:catch_signals()
local r, err = export.run(o.checkpoint, { out = o.out, tables = o.tables, per_table = o.per_table, dense = o.dense,
                                          chunk = o.chunk, print = print })
signals.finish(r and ("; %s was written before it stopped"):format(o.out)
  or ("; %s not written (its temporary file removed)"):format(o.out))
-- the library's messages say "export: ..."; the command's own prefix already says it
if not r then cmd:fail((tostring(err):gsub("^export: ", "", 1))) end
