/* metrics.h (kernels): launchers for kernels/metrics.cu, called by the CUDA backend's metrics
 * entries (engine/src/cuda/metrics.cu).  Each enqueues on the stream, on the current device,
 * and returns the first failing CUDA call's error; checking the job is the caller's work. */
#ifndef UR_KERNELS_METRICS_H
#define UR_KERNELS_METRICS_H

#include <cuda_runtime.h>
#include <stddef.h>

#include "metrics_job.h"

/* Adds job's samples into job->state (sums and, with bins, histograms) and, with a window,
 * writes their last min(n, window) into the ring. */
cudaError_t ur__cuda_metrics_update(cudaStream_t s, const ur__metrics_job *j);

/* job->raw [tasks, UR__M_RAW] = the sums of job's samples, and the AUC terms job asks for
 * (job->scratch must hold ur__cuda_metrics_scratch bytes). */
cudaError_t ur__cuda_metrics_window(cudaStream_t s, const ur__metrics_job *j);

/* job->raw [tasks, UR__M_RAW] = job->state's sums and its histograms' AUC terms. */
cudaError_t ur__cuda_metrics_lifetime(cudaStream_t s, const ur__metrics_job *j);

/* Scratch bytes ur__cuda_metrics_window needs for job->n samples (no GPU work). */
cudaError_t ur__cuda_metrics_scratch(const ur__metrics_job *j, size_t *bytes);

#endif
