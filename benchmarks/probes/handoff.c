/* What it costs one core to read or overwrite a buffer another core just wrote, against
 * the same on its own buffer: the hand-off between ops that a 2-thread prefill does at
 * every step (an op's output, written by both threads, is the next op's input, and the
 * arena hands its memory to later outputs).
 *
 *   handoff KB [ROUNDS]   (the first two CPUs the process may use; 200 rounds)
 *
 * Prints one line: GB/s of `own-read other-read own-write other-write`, each the median
 * over the rounds, the two threads taking the roles in turn. Before each timed pass the
 * buffer is written (and read back) by the core it names: "own" the same core, "other"
 * the other one. benchmarks/probes/handoff.py builds and runs it.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { kPatterns = 4, kMaxRounds = 2000 };
static const char* const kNames[kPatterns] = {"own-read", "other-read", "own-write",
                                              "other-write"};
static float* g_buffer;
static size_t g_floats;
static int g_rounds, g_cpus[2];
static _Atomic long g_step __attribute__((aligned(64)));
static double g_seconds[kPatterns][kMaxRounds];
static volatile float g_sink;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Built with -O3 -march=native (handoff.py): both loops become the widest vector loads
 * and stores the CPU has, as the ops' own loops are. */
static void fill(float value) {
  for (size_t i = 0; i < g_floats; ++i) g_buffer[i] = value + (float)(i & 1023);
}

static void sum(void) {  // 128 partial sums: bound by moving the lines, not by add latency
  float acc[128] = {0};
  for (size_t i = 0; i < g_floats; i += 128)
    for (int k = 0; k < 128; ++k) acc[k] += g_buffer[i + k];
  float total = 0;
  for (int k = 0; k < 128; ++k) total += acc[k];
  g_sink = total;
}

/* Round r of pattern p: thread `first` (alternating) writes and reads the buffer, then
 * the timed pass runs on `first` (own) or the other thread (other). */
static void* run(void* arg) {
  const int me = (int)(long)arg;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(g_cpus[me], &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  long step = 0;
  for (int p = 0; p < kPatterns; ++p)
    for (int r = 0; r < g_rounds; ++r, step += 2) {
      const int first = r % 2, timed = (p % 2 == 0) ? first : 1 - first;
      if (me == first) {
        while (atomic_load(&g_step) < step) {}
        fill((float)r);
        sum();
        atomic_store(&g_step, step + 1);
      }
      if (me == timed) {
        while (atomic_load(&g_step) < step + 1) {}
        const double start = now();
        if (p < 2) sum(); else fill((float)-r);
        g_seconds[p][r] = now() - start;
        atomic_store(&g_step, step + 2);
      }
    }
  return NULL;
}

static int compare(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  const long kb = argc >= 2 ? atol(argv[1]) : 0;
  g_rounds = argc >= 3 ? atoi(argv[2]) : 200;
  cpu_set_t allowed;
  sched_getaffinity(0, sizeof allowed, &allowed);
  int found = 0;
  for (int c = 0; c < CPU_SETSIZE && found < 2; ++c)
    if (CPU_ISSET(c, &allowed)) g_cpus[found++] = c;
  if (found < 2 || kb < 1 || kb > (1 << 20) || g_rounds < 2 || g_rounds > kMaxRounds) {
    fprintf(stderr, "handoff: needs two CPUs, 1..1048576 KB and 2..%d rounds\n", kMaxRounds);
    return 2;
  }
  g_floats = (size_t)kb * 1024 / sizeof(float) / 128 * 128;
  g_buffer = aligned_alloc(64, g_floats * sizeof(float));
  if (g_buffer == NULL) return 1;
  memset(g_buffer, 0, g_floats * sizeof(float));
  pthread_t threads[2];
  for (long i = 0; i < 2; ++i)
    if (pthread_create(&threads[i], NULL, run, (void*)i) != 0) {
      fprintf(stderr, "handoff: cannot start a thread\n");
      return 1;
    }
  for (int i = 0; i < 2; ++i) pthread_join(threads[i], NULL);
  for (int p = 0; p < kPatterns; ++p) {
    qsort(g_seconds[p], g_rounds, sizeof(double), compare);
    printf("%s%s=%.2f", p ? " " : "", kNames[p],
           g_floats * sizeof(float) / g_seconds[p][g_rounds / 2] / 1e9);
  }
  printf("\n");
  return 0;
}
