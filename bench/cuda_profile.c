/*
 * A kernel-level GPU profile of any CUDA program, for machines without Nsight: a CUPTI injection
 * library. The CUDA driver loads it at cuInit when CUDA_INJECTION64_PATH names it; it records
 * every kernel, copy and memset (CUPTI's activity API, timestamps taken on the GPU) and, at
 * exit, prints per kernel name: total GPU time, launches and mean time, sorted by total, plus
 * how much of the span between the first and last GPU activity the GPU was busy. A busy share
 * well under 100% means the host (launch and allocation overhead) is the bottleneck, not the
 * kernels.
 *
 * With CUDA_PROFILE_DRIVER=1 it also counts driver API calls by name and their host time
 * (cuEventCreate, cuMemAllocAsync, cuLaunchKernel, ...), which costs some speed.
 * CUDA_PROFILE_OUT names the report file (default: standard error);
 * CUDA_PROFILE_SKIP_MS ignores activity in the first milliseconds after the first kernel (the
 * warm-up: cuBLAS heuristics, first allocations); CUDA_PROFILE_TOP limits the rows (default 40).
 *
 * Build (headers and library from a CUPTI install, e.g. the nvidia-cuda-cupti wheel):
 *   gcc -O2 -shared -fPIC -I$CUPTI/include bench/cuda_profile.c -L$CUPTI/lib -l:libcupti.so.13 \
 *       -o cuda_profile.so
 * Use: CUDA_INJECTION64_PATH=$PWD/cuda_profile.so trainyard train ...
 * The program must exit normally (atexit handlers run) for the report to be written.
 */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUFFER_BYTES (16u << 20)
#define TABLE_SLOTS 8192u /* power of two; distinct kernel names in a training run: a few hundred */

typedef struct {
  char *name;
  uint64_t total_ns;
  uint64_t count;
} Row;

static Row kernels[TABLE_SLOTS];
static Row driver_calls[TABLE_SLOTS];
static uint64_t first_start = UINT64_MAX, last_end = 0, busy_ns = 0, skip_ns = 0;
static uint64_t window_start = 0;

static uint64_t hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ull;
  return h;
}

static void add(Row *table, const char *name, uint64_t ns) {
  uint64_t i = hash(name) & (TABLE_SLOTS - 1);
  while (table[i].name && strcmp(table[i].name, name) != 0) i = (i + 1) & (TABLE_SLOTS - 1);
  if (!table[i].name) table[i].name = strdup(name);
  table[i].total_ns += ns;
  table[i].count += 1;
}

/* Activities inside the measured window only (after the warm-up skip). */
static int in_window(uint64_t start) {
  if (first_start == UINT64_MAX || start < first_start) first_start = start;
  window_start = first_start + skip_ns;
  return start >= window_start;
}

static void gpu_activity(const char *name, uint64_t start, uint64_t end) {
  if (!in_window(start)) return;
  add(kernels, name, end - start);
  busy_ns += end - start;
  if (end > last_end) last_end = end;
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = aligned_alloc(8, BUFFER_BYTES);
  *size = BUFFER_BYTES;
  *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer,
                                      size_t size, size_t valid) {
  (void)ctx;
  (void)stream;
  (void)size;
  CUpti_Activity *record = NULL;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        CUpti_ActivityKernel10 *k = (CUpti_ActivityKernel10 *)record;
        gpu_activity(k->name ? k->name : "(unnamed kernel)", k->start, k->end);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        CUpti_ActivityMemcpy6 *m = (CUpti_ActivityMemcpy6 *)record;
        const char *kind = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "[copy host to device]"
                           : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "[copy device to host]"
                                                                            : "[copy other]";
        gpu_activity(kind, m->start, m->end);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        CUpti_ActivityMemset4 *m = (CUpti_ActivityMemset4 *)record;
        gpu_activity("[memset]", m->start, m->end);
        break;
      }
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        CUpti_ActivityAPI *a = (CUpti_ActivityAPI *)record;
        if (window_start && a->start >= window_start) {
          const char *name = NULL;
          cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, &name);
          add(driver_calls, name ? name : "(driver call)", a->end - a->start);
        }
        break;
      }
      default:
        break;
    }
  }
  free(buffer);
}

static int by_total(const void *a, const void *b) {
  const Row *x = a, *y = b;
  return (y->total_ns > x->total_ns) - (y->total_ns < x->total_ns);
}

static size_t sorted(Row *table) {
  size_t n = 0;
  for (size_t i = 0; i < TABLE_SLOTS; i++)
    if (table[i].name) table[n++] = table[i];
  qsort(table, n, sizeof(Row), by_total);
  return n;
}

static void report(void) {
  cuptiActivityFlushAll(1);
  const char *path = getenv("CUDA_PROFILE_OUT");
  FILE *out = path ? fopen(path, "w") : stderr;
  if (!out) out = stderr;
  const char *top_env = getenv("CUDA_PROFILE_TOP");
  size_t top = top_env ? (size_t)atoi(top_env) : 40;
  size_t n = sorted(kernels);
  uint64_t launches = 0;
  for (size_t i = 0; i < n; i++) launches += kernels[i].count;
  double span_ms = last_end > window_start ? (last_end - window_start) / 1e6 : 0.0;
  fprintf(out, "# GPU profile: span %.1f ms, GPU busy %.1f ms (%.1f%%), %llu activities, %zu names\n",
          span_ms, busy_ns / 1e6, span_ms > 0 ? 100.0 * busy_ns / 1e6 / span_ms : 0.0,
          (unsigned long long)launches, n);
  fprintf(out, "%10s %6s %9s %10s  %s\n", "total_ms", "share", "count", "mean_us", "name");
  for (size_t i = 0; i < n && i < top; i++) {
    fprintf(out, "%10.2f %5.1f%% %9llu %10.2f  %.150s\n", kernels[i].total_ns / 1e6,
            busy_ns ? 100.0 * kernels[i].total_ns / busy_ns : 0.0,
            (unsigned long long)kernels[i].count,
            kernels[i].total_ns / 1e3 / (double)kernels[i].count, kernels[i].name);
  }
  size_t d = sorted(driver_calls);
  if (d) fprintf(out, "# driver API calls (host time)\n");
  for (size_t i = 0; i < d && i < top; i++) {
    fprintf(out, "%10.2f %9llu %10.2f  %s\n", driver_calls[i].total_ns / 1e6,
            (unsigned long long)driver_calls[i].count,
            driver_calls[i].total_ns / 1e3 / (double)driver_calls[i].count, driver_calls[i].name);
  }
  if (out != stderr) fclose(out);
}

/* Called by the CUDA driver when CUDA_INJECTION64_PATH names this library. */
int InitializeInjection(void) {
  const char *skip = getenv("CUDA_PROFILE_SKIP_MS");
  skip_ns = skip ? (uint64_t)(atof(skip) * 1e6) : 0;
  cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  const char *driver = getenv("CUDA_PROFILE_DRIVER");
  if (driver && *driver == '1') cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER);
  atexit(report);
  return 1;
}
