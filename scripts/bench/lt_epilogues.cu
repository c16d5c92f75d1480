/* lt_epilogues.cu: which cuBLASLt epilogues this GPU's cuBLASLt offers for the products of
 * DLRM's MLPs (bf16, and f32 under TF32; batch 65536), laid out as kernels/linear.cu lays them
 * out, and what each costs against the bare product.  The engine falls back to cuBLAS plus its own kernels where
 * cuBLASLt finds no algorithm (ur_matmul's `plain`): this shows where, and what fusing would
 * save.  For every usable epilogue it checks the result against the bare product (masked
 * elements exactly, bias gradients within 1e-2 relative of a double column sum) and runs it
 * twice to see whether its bias gradient is the same bits.
 *
 *   make dist (dist/bin/lt_epilogues where CUDA is built), or
 *   nvcc -O2 -arch=sm_90 -o lt_epilogues scripts/bench/lt_epilogues.cu -lcublasLt
 *   ./lt_epilogues [rows [in out]]  (rows: 65536 by default; in out: one layer's shape instead
 *                                    of DLRM's, e.g. for compute-sanitizer on one product) */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "bench_cuda.h"

static const size_t WS = 32u << 20;
static cudaDataType_t g_ab = CUDA_R_16BF;           /* A, B and the products' D */
static cublasComputeType_t g_compute = CUBLAS_COMPUTE_32F;

struct Case {
  const char *what;
  int ta, tb;
  int64_t m, n, k, lda, ldb, ldd;
  cudaDataType_t cd;
  cublasLtEpilogue_t epi;
  cudaDataType_t bias_type; /* CUDA_R_32F or CUDA_R_16BF (or 0: none) */
};

static const char *epi_name(cublasLtEpilogue_t e) {
  switch (e) {
  case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
  case CUBLASLT_EPILOGUE_RELU_BIAS: return "RELU_BIAS";
  case CUBLASLT_EPILOGUE_RELU_AUX_BIAS: return "RELU_AUX_BIAS";
  case CUBLASLT_EPILOGUE_DRELU: return "DRELU";
  case CUBLASLT_EPILOGUE_DRELU_BGRAD: return "DRELU_BGRAD";
  case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
  default: return "?";
  }
}

/* A hash of element i: the inputs are the same on every run. */
__device__ uint32_t mix(int64_t i, uint32_t seed) {
  uint32_t h = (uint32_t)i * 2654435761u ^ seed;
  h ^= h >> 15;
  h *= 2246822519u;
  return h ^ (h >> 13);
}

/* Values in [-0.125, 0.125) (bf16 or f32), or bytes (the ReLU masks' bits). */
template <typename T>
__global__ void fill(T *p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = mix(i, seed);
    if (sizeof(T) == 1) p[i] = (T)(h >> 7);
    else p[i] = (T)(((h & 0xffff) / 65536.0f - 0.5f) * 0.25f);
  }
}

struct Result {
  int status, found;
  float ms;
};

static cublasLtHandle_t lt;
static void *ws;

/* Sets up and (when usable) runs the case `reps` times; the last run's output stays in D. */
static Result run(const Case &c, const void *A, const void *B, void *D, void *bias, void *aux,
                  int64_t aux_ld, int reps) {
  Result r = {0, 0, -1.0f};
  cublasLtMatmulDesc_t desc = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  cublasOperation_t ta = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasStatus_t s = cublasLtMatmulDescCreate(&desc, g_compute, CUDA_R_32F);
  if (!s) s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  if (!s) s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  if (!s) s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &c.epi, sizeof c.epi);
  if (!s && c.bias_type) {
    /* the type set only where it is not D's, as kernels/linear.cu sets it (bias_f32) */
    int32_t bt = c.bias_type;
    if (c.bias_type != c.cd)
      s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
    if (!s) s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  }
  if (!s && (c.epi & 128)) {
    s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
    if (!s) s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld);
  }
  uint64_t ar = c.ta ? c.k : c.m, ac = c.ta ? c.m : c.k;
  uint64_t br = c.tb ? c.n : c.k, bc = c.tb ? c.k : c.n;
  if (!s) s = cublasLtMatrixLayoutCreate(&la, g_ab, ar, ac, c.lda);
  if (!s) s = cublasLtMatrixLayoutCreate(&lb, g_ab, br, bc, c.ldb);
  if (!s) s = cublasLtMatrixLayoutCreate(&ld, c.cd, c.m, c.n, c.ldd);
  if (!s) s = cublasLtMatmulPreferenceCreate(&pref);
  uint64_t wsb = WS;
  if (!s) s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
  cublasLtMatmulHeuristicResult_t res[8];
  if (!s) s = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 8, res, &r.found);
  r.status = (int)s;
  if (!s && r.found > 0) {
    float alpha = 1.0f, beta = 0.0f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    /* the heuristic's first algorithm, as the engine takes it */
    for (int i = 0; i < 3 && !s; i++)
      s = cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &res[0].algo, ws, WS, 0);
    CK(cudaEventRecord(e0));
    for (int i = 0; i < reps && !s; i++)
      s = cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &res[0].algo, ws, WS, 0);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    r.ms = s ? -1.0f : t / reps;
    r.status = (int)s;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (ld) cublasLtMatrixLayoutDestroy(ld);
  if (desc) cublasLtMatmulDescDestroy(desc);
  return r;
}

/* Element i of a D as a float (bf16 or f32), and its bits. */
static float val(const std::vector<uint8_t> &d, size_t i) {
  uint32_t u = 0;
  if (g_ab == CUDA_R_16BF) {
    uint16_t h;
    memcpy(&h, &d[i * 2], 2);
    u = (uint32_t)h << 16;
  } else {
    memcpy(&u, &d[i * 4], 4);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void probe(int64_t rows, int64_t in, int64_t out);

int main(int argc, char **argv) {
  int64_t rows = argc > 1 ? atoll(argv[1]) : 65536;
  int64_t in = argc > 3 ? atoll(argv[2]) : 0, out = argc > 3 ? atoll(argv[3]) : 0;
  if (rows < 1 || (argc > 3 && (in < 1 || out < 1 || in > 1024 || out > 1024))) {
    fprintf(stderr, "lt_epilogues: rows %lld, in %lld, out %lld; expected rows >= 1 and a layer "
            "of 1 to 1024 columns each way\n", (long long)rows, (long long)in, (long long)out);
    return 2;
  }
  if (cublasLtCreate(&lt)) {
    fprintf(stderr, "cublasLtCreate failed\n");
    return 1;
  }
  printf("cuBLASLt %zu, rows %lld\n", cublasLtGetVersion(), (long long)rows);
  CK(cudaMalloc(&ws, WS));
  for (int pass = 0; pass < 2; pass++) {
    g_ab = pass ? CUDA_R_32F : CUDA_R_16BF;
    g_compute = pass ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    printf("\n%s\n", pass ? "f32 under TF32" : "bf16");
    probe(rows, in, out);
  }
  return 0;
}

static void probe(int64_t rows, int64_t one_in, int64_t one_out) {
  const int64_t W = 1024;
  const size_t es = g_ab == CUDA_R_16BF ? 2 : 4;
  void *A, *B, *D, *D0, *bias, *bias2, *aux;
  CK(cudaMalloc(&A, W * W * 4));
  CK(cudaMalloc(&B, rows * W * 4));
  CK(cudaMalloc(&D, rows * W * 4));
  CK(cudaMalloc(&D0, rows * W * 4));
  CK(cudaMalloc(&bias, W * 4));
  CK(cudaMalloc(&bias2, W * 4));
  CK(cudaMalloc(&aux, rows * W / 8));
  if (es == 2) {
    fill<<<1024, 256>>>((__nv_bfloat16 *)A, W * W, 1);
    fill<<<1024, 256>>>((__nv_bfloat16 *)B, rows * W, 2);
  } else {
    fill<<<1024, 256>>>((float *)A, W * W, 1);
    fill<<<1024, 256>>>((float *)B, rows * W, 2);
  }
  fill<<<1024, 256>>>((uint8_t *)aux, rows * W / 8, 3);
  CK(cudaDeviceSynchronize());
  /* (in, out) of the ReLU layers: top 479(480)->1024->1024->512->256, bottom 512->256->128 */
  const int64_t shapes[][2] = {{480, 1024}, {1024, 1024}, {1024, 512}, {512, 256}, {256, 128}};
  const cublasLtEpilogue_t bwd[] = {CUBLASLT_EPILOGUE_DRELU, CUBLASLT_EPILOGUE_DRELU_BGRAD};
  const cudaDataType_t btypes[] = {CUDA_R_32F, g_ab};
  const int nbt = g_ab == CUDA_R_32F ? 1 : 2;
  printf("%-14s %5s %5s %-14s %-5s %6s %5s %9s %9s %s\n", "product", "in", "out", "epilogue",
         "bias", "status", "algos", "ms", "bare ms", "check");
  for (int si = 0; si < (one_in ? 1 : 5); si++) {
    int64_t in = one_in ? one_in : shapes[si][0], out = one_in ? one_out : shapes[si][1];
    int64_t mask_ld = (in + 127) / 128 * 128;         /* bits, as ur__mask_cols * 8 */
    int64_t mask_ld_out = (out + 127) / 128 * 128;
    /* backward input gradient: gx^T (in x rows) = w (in x out, col-major) g^T (out x rows) */
    Case bare = {"dgrad", 0, 0, in, rows, out, in, out, in, g_ab, CUBLASLT_EPILOGUE_DEFAULT, (cudaDataType_t)0};
    Result rb = run(bare, A, B, D0, NULL, NULL, 0, 20);
    printf("%-14s %5lld %5lld %-14s %-5s %6d %5d %9.4f %9s\n", bare.what, (long long)in,
           (long long)out, "DEFAULT", "-", rb.status, rb.found, rb.ms, "");
    for (auto epi : bwd)
      for (int bi = 0; bi < (epi == CUBLASLT_EPILOGUE_DRELU_BGRAD ? nbt : 1); bi++) {
        Case c = bare;
        c.epi = epi;
        c.bias_type = epi == CUBLASLT_EPILOGUE_DRELU_BGRAD ? btypes[bi] : (cudaDataType_t)0;
        CK(cudaMemset(bias, 0, W * 4));
        Result r = run(c, A, B, D, bias, aux, mask_ld, 20);
        char check[160] = "";
        if (r.ms >= 0) {
          /* masked elements exactly as the bare product's, the others zero */
          std::vector<uint8_t> d((size_t)(in * rows) * es), d0((size_t)(in * rows) * es);
          std::vector<uint8_t> m((size_t)(mask_ld / 8 * rows));
          CK(cudaMemcpy(d.data(), D, d.size(), cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(d0.data(), D0, d0.size(), cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(m.data(), aux, m.size(), cudaMemcpyDeviceToHost));
          int64_t bad = 0;
          std::vector<double> cs((size_t)in, 0.0);
          for (int64_t j = 0; j < rows; j++)
            for (int64_t i = 0; i < in; i++) {
              int64_t bit = j * mask_ld + i;
              int on = (m[(size_t)(bit >> 3)] >> (bit & 7)) & 1;
              size_t at = (size_t)(j * in + i);
              float got = val(d, at);
              if (on ? memcmp(&d[at * es], &d0[at * es], es) != 0 : got != 0.0f) bad++;
              cs[(size_t)i] += got;
            }
          snprintf(check, sizeof check, "masked: %lld wrong", (long long)bad);
          if (c.bias_type) {
            std::vector<uint8_t> bh((size_t)in * 4);
            double worst = 0;
            CK(cudaMemcpy(bh.data(), bias, in * 4, cudaMemcpyDeviceToHost));
            cudaDataType_t keep = g_ab;
            g_ab = c.bias_type;
            for (int64_t i = 0; i < in; i++) {
              double e = fabs(val(bh, (size_t)i) - cs[(size_t)i]) / (fabs(cs[(size_t)i]) + 1.0);
              if (e > worst) worst = e;
            }
            g_ab = keep;
            /* the same bits again? */
            CK(cudaMemcpy(bias2, bias, in * 4, cudaMemcpyDeviceToDevice));
            CK(cudaMemset(bias, 0, W * 4));
            run(c, A, B, D, bias, aux, mask_ld, 1);
            std::vector<uint8_t> x1((size_t)in * 4), x2((size_t)in * 4);
            CK(cudaMemcpy(x1.data(), bias, in * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(x2.data(), bias2, in * 4, cudaMemcpyDeviceToHost));
            size_t nb = (size_t)in * (c.bias_type == CUDA_R_32F ? 4 : 2);
            snprintf(check + strlen(check), sizeof check - strlen(check),
                     "; bias worst rel %.2e; same bits twice: %s", worst,
                     memcmp(x1.data(), x2.data(), nb) ? "NO" : "yes");
          }
        }
        printf("%-14s %5lld %5lld %-14s %-5s %6d %5d %9.4f %9.4f %s\n", c.what, (long long)in,
               (long long)out, epi_name(epi), c.bias_type == CUDA_R_32F ? "f32" : c.bias_type ? "bf16" : "-",
               r.status, r.found, r.ms, rb.ms, check);
      }
    /* forward: y^T (out x rows) = w^T (w stored in x out as k x m, transposed) x^T */
    Case fb = {"fwd", 1, 0, out, rows, in, in, in, out, g_ab, CUBLASLT_EPILOGUE_DEFAULT, (cudaDataType_t)0};
    Result rf = run(fb, A, B, D0, NULL, NULL, 0, 20);
    printf("%-14s %5lld %5lld %-14s %-5s %6d %5d %9.4f\n", fb.what, (long long)in, (long long)out,
           "DEFAULT", "-", rf.status, rf.found, rf.ms);
    const cublasLtEpilogue_t fwd[] = {CUBLASLT_EPILOGUE_RELU_BIAS, CUBLASLT_EPILOGUE_RELU_AUX_BIAS};
    for (auto epi : fwd)
      for (int bi = 0; bi < 2; bi++) {
        Case c = fb;
        c.epi = epi;
        c.bias_type = btypes[bi];
        Result r = run(c, A, B, D, bias, aux, mask_ld_out, 20);
        printf("%-14s %5lld %5lld %-14s %-5s %6d %5d %9.4f %9.4f\n", c.what, (long long)in,
               (long long)out, epi_name(epi), bi ? "bf16" : "f32", r.status, r.found, r.ms, rf.ms);
      }
    /* weight gradient: gw^T (in x out, f32) += x^T (in x rows) g (rows x out as out x rows^T) */
    Case wb = {"wgrad", 0, 1, in, out, rows, in, out, in, CUDA_R_32F, CUBLASLT_EPILOGUE_DEFAULT, (cudaDataType_t)0};
    Result rw = run(wb, B, B, D0, NULL, NULL, 0, 20);
    printf("%-14s %5lld %5lld %-14s %-5s %6d %5d %9.4f\n", wb.what, (long long)in, (long long)out,
           "DEFAULT", "-", rw.status, rw.found, rw.ms);
    Case c = wb;
    c.epi = CUBLASLT_EPILOGUE_BGRADB;
    c.bias_type = CUDA_R_32F; /* the engine's: gb is f32 */
    Result r = run(c, B, B, D, bias, NULL, 0, 20);
    char check[96] = "";
    if (r.ms >= 0) {
      CK(cudaMemcpy(bias2, bias, out * 4, cudaMemcpyDeviceToDevice));
      run(c, B, B, D, bias, NULL, 0, 1);
      std::vector<uint8_t> x1((size_t)out * 4), x2((size_t)out * 4);
      CK(cudaMemcpy(x1.data(), bias, out * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(x2.data(), bias2, out * 4, cudaMemcpyDeviceToHost));
      snprintf(check, sizeof check, "same bits twice: %s", memcmp(x1.data(), x2.data(), x1.size()) ? "NO" : "yes");
    }
    printf("%-14s %5lld %5lld %-14s %-5s %6d %5d %9.4f %9.4f %s\n", c.what, (long long)in,
           (long long)out, "BGRADB", "f32", r.status, r.found, r.ms, rw.ms, check);
  }
  CK(cudaFree(A));
  CK(cudaFree(B));
  CK(cudaFree(D));
  CK(cudaFree(D0));
  CK(cudaFree(bias));
  CK(cudaFree(bias2));
  CK(cudaFree(aux));
}
