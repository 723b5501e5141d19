/* One-way core-to-core latency: two threads pinned to two CPUs hand a counter back and
 * forth through one cache line; prints the median over the rounds, in ns.
 *
 *   core_latency [ROUNDS]   (the first two CPUs the process may use; 5 rounds)
 *
 * On the 2-vCPU VMs the host sometimes places the two vCPUs on different CCDs of its
 * EPYC: ~40 ns then becomes ~175 ns, and edgeprefill's prefill runs ~30% slower (the
 * "slow mode", docs/benchmarks.md). benchmarks/probes/core_latency.py builds and runs it.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { kTrips = 100000 };
static _Atomic long g_turn __attribute__((aligned(64)));
static int g_cpu_b;

static int pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void* answer(void* unused) {
  (void)unused;
  pin(g_cpu_b);
  for (long i = 0; i < kTrips; ++i) {
    while (atomic_load_explicit(&g_turn, memory_order_acquire) != 2 * i + 1) {}
    atomic_store_explicit(&g_turn, 2 * i + 2, memory_order_release);
  }
  return NULL;
}

static int compare(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  int cpus[2] = {-1, -1};
  cpu_set_t allowed;
  sched_getaffinity(0, sizeof allowed, &allowed);
  for (int c = 0, found = 0; c < CPU_SETSIZE && found < 2; ++c)
    if (CPU_ISSET(c, &allowed)) cpus[found++] = c;
  const int reps = argc >= 2 ? atoi(argv[1]) : 5;
  if (cpus[1] < 0 || reps < 1 || reps > 100) {
    fprintf(stderr, "core_latency: needs two CPUs and 1..100 rounds\n");
    return 2;
  }
  g_cpu_b = cpus[1];
  double ns[100];
  for (int r = 0; r < reps; ++r) {
    atomic_store(&g_turn, 0);
    pthread_t other;
    if (pin(cpus[0]) != 0 || pthread_create(&other, NULL, answer, NULL) != 0) {
      fprintf(stderr, "core_latency: cannot pin or start a thread\n");
      return 1;
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < kTrips; ++i) {
      atomic_store_explicit(&g_turn, 2 * i + 1, memory_order_release);
      while (atomic_load_explicit(&g_turn, memory_order_acquire) != 2 * i + 2) {}
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_join(other, NULL);
    ns[r] = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / kTrips / 2;
  }
  qsort(ns, reps, sizeof ns[0], compare);
  printf("%.1f\n", ns[reps / 2]);
  return 0;
}
