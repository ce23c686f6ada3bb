/* baregrad CPU command processor.
 *
 * The CPU device runs on the same queue model as a GPU: the host writes command packets into a
 * ring in memory, publishes `wptr` and rings a doorbell; this worker (run on its own thread)
 * consumes the packets in order, like a GPU's command processor consumes its ring.
 *
 * Packets are little-endian uint64 words. Header: opcode | (nwords << 16), nwords counting the
 * header. Word k of the packet at position pos is ring[(pos + k) & (ring_words - 1)].
 *   0 NOP                      skip
 *   1 EXEC(fn, args)           ((void (*)(const uint64_t *))fn)(args)
 *   2 COPY(dst, src, nbytes)   memcpy
 *   3 SIGNAL(addr, value)      release-store *addr = value, futex-wake the low 32-bit word
 *   4 WAIT(addr, value)        block until *addr >= value (spin, then futex on the low word)
 *   5 TIMESTAMP(addr)          *addr = CLOCK_MONOTONIC in ns
 *   6 BARRIER()                full memory fence
 *   7 INDIRECT(addr, nwords)   run the packets of a linear buffer (no INDIRECT inside it)
 *   8 EXEC_MT(fn, args, n)     fn(args, i) for i in [0, n): chunks shared with the helper threads
 * A fault signal inside a kernel (a wild store: SIGSEGV; an integer division by zero: SIGFPE) stops the kernel and
 * faults the queue like a bad packet (BG_FAULT_KERNEL, the signal and address in the control block).
 * A bad packet sets `fault` and the worker returns; the host reports it. With `checked` set (the CPU
 * device), operands are checked like a GPU's MMU would: addresses must lie in memory the driver
 * registered (bg_host_mmu_set), EXEC/EXEC_MT functions must be registered kernel entry points.
 *
 * Compiled freestanding by cc.py and loaded by baregrad's own ELF loader (elf.py): no libc
 * headers, the few libc functions it needs come in through struct bg_libc. Linux only (futex, getcpu,
 * sched_setaffinity). With the ring empty the worker spins a while (idle(): long enough for an eager host's next
 * doorbell, and not on the host thread's CPU), then sleeps until a doorbell wakes it.
 * The bg_host_* functions are for the host thread: waits and doorbells with the GIL released. A waiting host thread
 * runs chunks of the EXEC_MT kernel in flight (host_help), as a BLAS's calling thread computes its share.
 */
#include <stdint.h>
#include <stddef.h>

struct bg_timespec { long tv_sec; long tv_nsec; };

struct bg_libc {
  long (*syscall)(long number, ...);
  int (*clock_gettime)(int clock, struct bg_timespec *ts);
  void *(*memcpy)(void *dst, const void *src, size_t n);
};

/* Shared control block: one 64-byte line, layout mirrored by the cdef in processor.py. */
struct bg_ctl {
  uint64_t wptr;              /*  0 words written by the host (never wrapped) */
  uint64_t rptr;              /*  8 words consumed by the worker */
  uint32_t sleeping;          /* 16 1 while the worker blocks in futex on wptr */
  uint32_t stop;              /* 20 host sets 1: the worker returns */
  uint64_t fault;             /* 24 0, or a BG_FAULT_* code (the worker has stopped consuming) */
  uint64_t fault_info;        /* 32 header word of the faulting packet */
  uint64_t last_header_rptr;  /* 40 rptr of the packet being executed */
  uint32_t rptr_waiters;      /* 48 host threads blocked in bg_host_wait_rptr */
  uint32_t host_cpu;          /* 52 1 + the CPU the host rang the doorbell from (0: not known) */
  uint64_t fault_ib_offset;   /* 56 word offset + 1 of the faulting packet in an INDIRECT buffer; 0: in the ring */
  uint64_t fault_addr;        /* 64 BG_FAULT_ADDRESS: the address that is not mapped (or the unknown entry point) */
  uint64_t checked;           /* 72 1: packets may only touch registered memory and EXEC registered entries */
  uint64_t ib_progress;       /* 80 word offset + 1 of the INDIRECT buffer packet being executed; 0: none (the
                                    progress word a hang report reads, beside last_header_rptr) */
  uint64_t guard;             /* 88 the worker thread's fault guard (struct bg_guard *), set when it starts */
  uint64_t fault_signal;      /* 96 BG_FAULT_KERNEL: the signal that stopped the kernel (fault_addr: its address) */
  uint64_t pad[3];            /* 104 */
};
_Static_assert(sizeof(struct bg_ctl) == 128, "the control block is two 64-byte lines");

enum { BG_NOP, BG_EXEC, BG_COPY, BG_SIGNAL, BG_WAIT, BG_TIMESTAMP, BG_BARRIER, BG_INDIRECT, BG_EXEC_MT, BG_NUM_OPCODES };
enum { BG_OK, BG_FAULT_OPCODE, BG_FAULT_SIZE, BG_FAULT_NESTED_INDIRECT, BG_FAULT_ADDRESS, BG_FAULT_ENTRY, BG_FAULT_KERNEL,
       BG_STOPPED = 0xff };
enum { BG_WAIT_DONE, BG_WAIT_TIMEOUT, BG_WAIT_ABORTED };

/* smallest packet of each opcode, header included */
static const uint8_t min_words[BG_NUM_OPCODES] = {1, 3, 4, 3, 3, 2, 1, 3, 4};

/* Linux facts: <asm/unistd_64.h> / asm-generic <unistd.h> (futex), <linux/futex.h>, <linux/time.h> */
#if defined(__x86_64__)
#define SYS_FUTEX 202
#define SYS_SCHED_YIELD 24
#define SYS_SCHED_SETAFFINITY 203
#define SYS_SCHED_GETAFFINITY 204
#define SYS_GETCPU 309
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define SYS_FUTEX 98
#define SYS_SCHED_YIELD 124
#define SYS_SCHED_SETAFFINITY 122
#define SYS_SCHED_GETAFFINITY 123
#define SYS_GETCPU 168
#define CPU_RELAX() __asm__ volatile("yield" ::: "memory")
#else
#error "the CPU command processor supports x86-64 and aarch64"
#endif
/* signals (<asm/signal.h>: the same numbers on x86-64 and arm64) and rt_sigaction (<asm/unistd*.h>, the kernel's
 * struct sigaction: handler, flags, restorer, mask) for kernel faults */
#if defined(__x86_64__)
#define SYS_RT_SIGACTION 13
#define SYS_GETTID 186
#define BG_SA_RESTORER 0x04000000   /* x86-64 needs a restorer that calls rt_sigreturn (15) */
__asm__(".text\n.local bg_restore_rt\n.type bg_restore_rt,@function\nbg_restore_rt:\n  mov $15, %eax\n  syscall\n");
void bg_restore_rt(void);
#define BG_RESTORER ((void *)bg_restore_rt)
#else
#define SYS_RT_SIGACTION 134
#define SYS_GETTID 178
#define BG_SA_RESTORER 0            /* arm64: the kernel returns through the vDSO's sigreturn */
#define BG_RESTORER ((void *)0)
#endif
#define BG_SA_SIGINFO 4
#define BG_SA_NODEFER 0x40000000      /* the signal stays unblocked: we leave the handler by a long jump */
#define FUTEX_WAIT_PRIVATE (0 | 128)
#define FUTEX_WAKE_PRIVATE (1 | 128)
#define CLOCK_MONOTONIC 1

#define SPIN_YIELD_EVERY 32         /* spinning: sched_yield every this many pauses, so a thread
                                       sharing our CPU (the host, or the worker) still runs */
#define WAIT_SPIN_NS 20000          /* WAIT packet: spin this long before sleeping */
#define IDLE_SPIN_NS 50000          /* empty ring: spin at least this long before sleeping */
#define IDLE_SPIN_MAX_NS 400000     /* ... and at most this long: a host submitting every gap < this keeps the worker
                                       spinning up to 4 gaps (idle()), so its doorbell needs no futex wake */
#define NUDGE_EVERY_NS 1000000     /* idle(): move off the host's CPU at most this often */
#define FUTEX_SLICE_NS 1000000      /* sleep at most this long per futex call, then look at stop/abort */
#define IDLE_SLEEP_NS 100000000     /* empty ring: the doorbell wakes us, this bounds a lost wake */

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

static int64_t now_ns(const struct bg_libc *libc) {
  struct bg_timespec ts;
  libc->clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* futex on the low 32 bits of a (little-endian) word; returns the raw syscall result */
static long futex_wait(const void *addr, uint32_t expected, int64_t timeout_ns, const struct bg_libc *libc) {
  struct bg_timespec ts = {(long)(timeout_ns / 1000000000), (long)(timeout_ns % 1000000000)};
  return libc->syscall(SYS_FUTEX, (long)addr, (long)FUTEX_WAIT_PRIVATE, (long)expected, (long)&ts, 0L, 0L);
}

static long futex_wake(const void *addr, int count, const struct bg_libc *libc) {
  return libc->syscall(SYS_FUTEX, (long)addr, (long)FUTEX_WAKE_PRIVATE, (long)count, 0L, 0L, 0L);
}

/* one step of a spin loop; returns the time every SPIN_YIELD_EVERY steps, else `t` */
static int64_t spin_step(uint32_t i, int64_t t, const struct bg_libc *libc) {
  CPU_RELAX();
  if (i % SPIN_YIELD_EVERY) return t;
  libc->syscall(SYS_SCHED_YIELD);
  return now_ns(libc);
}

struct bg_guard;
static int host_help(struct bg_guard **g, int64_t left_ns, const struct bg_libc *libc);

/* Block until *addr >= value: spin for spin_ns, then futex-wait on the low word in short slices,
 * giving up when *abort64 or *abort32 (either may be NULL) becomes nonzero or timeout_ns (< 0: never) passes.
 * help (a host thread's wait; NULL for the worker's): while spinning, run chunks of the multi-threaded kernel in
 * flight, under the guard *help (claimed on first use; the caller releases it). */
static int wait_ge(const uint64_t *addr, uint64_t value, int64_t timeout_ns, int64_t spin_ns,
                   const uint64_t *abort64, const uint32_t *abort32, struct bg_guard **help, const struct bg_libc *libc) {
  if (LOAD(addr) >= value) return BG_WAIT_DONE;
  int64_t start = now_ns(libc), t = start, spin_start = start;
  for (uint32_t i = 1; t - spin_start < spin_ns; i++) {
    if (LOAD(addr) >= value) return BG_WAIT_DONE;
    if (help && host_help(help, timeout_ns < 0 ? -1 : start + timeout_ns - t, libc)) {
      spin_start = t = now_ns(libc);    /* spin on after a chunk */
      continue;
    }
    t = spin_step(i, t, libc);
  }
  for (;;) {
    uint64_t seen = LOAD(addr);
    if (seen >= value) return BG_WAIT_DONE;
    if ((abort64 && LOAD(abort64)) || (abort32 && LOAD(abort32))) return BG_WAIT_ABORTED;
    int64_t slice = FUTEX_SLICE_NS;
    if (timeout_ns >= 0) {
      int64_t left = start + timeout_ns - now_ns(libc);
      if (left <= 0) return BG_WAIT_TIMEOUT;
      if (left < slice) slice = left;
    }
    futex_wait(addr, (uint32_t)seen, slice, libc);
  }
}

/* ---- kernel faults: a fault signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL) raised inside a kernel stops that kernel and
 * faults the queue, as a GPU's MMU fault does, instead of ending the process. Each thread that runs kernels owns a
 * guard slot (claimed by thread id); a kernel call arms it, the handler finds the faulting thread's armed guard and
 * jumps back to the call. A signal outside a kernel goes to the handler that was installed before ours. */
#define MAX_GUARDS 256
struct bg_guard { uint64_t tid; void *jmp[5]; uint32_t armed, sig; uint64_t addr; };
struct bg_kaction { void *handler; unsigned long flags; void *restorer; uint64_t mask; };
static struct bg_guard guards[MAX_GUARDS];
static struct bg_kaction old_actions[32];
static long (*fault_syscall)(long number, ...);
static const int FAULT_SIGNALS[4] = {4, 7, 8, 11};   /* SIGILL, SIGBUS, SIGFPE, SIGSEGV */

static struct bg_guard *claim_guard(const struct bg_libc *libc) {
  uint64_t tid = (uint64_t)libc->syscall(SYS_GETTID);
  for (int i = 0; i < MAX_GUARDS; i++) {
    uint64_t free_slot = 0;
    if (__atomic_compare_exchange_n(&guards[i].tid, &free_slot, tid, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      return &guards[i];
  }
  return (struct bg_guard *)0;      /* none left: this thread's kernels run unguarded */
}

static void release_guard(struct bg_guard *g) { if (g) STORE(&g->tid, 0); }

static void on_fault_signal(int sig, void *info, void *uctx) {
  (void)uctx;
  uint64_t tid = (uint64_t)fault_syscall(SYS_GETTID);
  for (int i = 0; i < MAX_GUARDS; i++) {
    struct bg_guard *g = &guards[i];
    if (LOAD(&g->tid) == tid && LOAD(&g->armed)) {
      g->armed = 0;
      g->sig = (uint32_t)sig;
      g->addr = *(const uint64_t *)((const char *)info + 16);    /* siginfo_t si_addr (64-bit Linux) */
      __builtin_longjmp(g->jmp, 1);
    }
  }
  /* not a kernel's: the handler that was there before ours (Python's faulthandler, a runtime's own) runs it; with none
   * (the default action), put the default back: the instruction faults again and the process ends as without us */
  struct bg_kaction *old = &old_actions[sig];
  if (old->handler == (void *)0 || old->handler == (void *)1) {          /* SIG_DFL, SIG_IGN */
    fault_syscall(SYS_RT_SIGACTION, (long)sig, (long)old, 0L, 8L);
    return;
  }
  if (old->flags & BG_SA_SIGINFO) ((void (*)(int, void *, void *))old->handler)(sig, info, uctx);
  else ((void (*)(int))old->handler)(sig);
}

/* fn(args, chunk) under the thread's guard: 0, or the signal that stopped it (g->addr: the faulting address) */
__attribute__((noinline)) static int guarded_call(struct bg_guard *g, uint64_t fn, uint64_t args, int64_t chunk) {
  typedef void (*kernel_t)(const uint64_t *, int64_t);
  if (!g) { ((kernel_t)fn)((const uint64_t *)args, chunk); return 0; }
  if (__builtin_setjmp(g->jmp)) return (int)g->sig;
  __atomic_store_n(&g->armed, 1, __ATOMIC_RELAXED);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  ((kernel_t)fn)((const uint64_t *)args, chunk);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  __atomic_store_n(&g->armed, 0, __ATOMIC_RELAXED);
  return 0;
}

/* fn(a, b) -> int (another library's kernel launcher: the emulated Metal GPU's) under a guard of the calling thread:
 * its result, or minus the fault signal that stopped it (*addr: the faulting address). */
int bg_host_guarded_launch(uint64_t fn, uint64_t a, uint64_t b, uint64_t *addr, const struct bg_libc *libc) {
  typedef int (*launch_t)(void *, void *);
  struct bg_guard *g = claim_guard(libc);
  if (!g) return ((launch_t)fn)((void *)a, (void *)b);
  volatile int rc = 0;
  if (__builtin_setjmp(g->jmp)) { *addr = g->addr; rc = -(int)g->sig; }
  else {
    __atomic_store_n(&g->armed, 1, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    rc = ((launch_t)fn)((void *)a, (void *)b);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    __atomic_store_n(&g->armed, 0, __ATOMIC_RELAXED);
  }
  release_guard(g);
  return rc;
}

/* Install the fault handler (once per loaded worker image; the host calls it when it loads the image). */
void bg_host_install_fault_handler(const struct bg_libc *libc) {
  fault_syscall = libc->syscall;
  struct bg_kaction act = {(void *)on_fault_signal, BG_SA_SIGINFO | BG_SA_NODEFER | BG_SA_RESTORER, BG_RESTORER, 0};
  for (int k = 0; k < 4; k++)
    libc->syscall(SYS_RT_SIGACTION, (long)FAULT_SIGNALS[k], (long)&act, (long)&old_actions[FAULT_SIGNALS[k]], 8L);
}

static void set_fault(struct bg_ctl *ctl, uint64_t code, uint64_t header, uint64_t ib_offset, const struct bg_libc *libc) {
  ctl->fault_info = header;
  ctl->fault_ib_offset = ib_offset;
  STORE(&ctl->fault, code);
  futex_wake(&ctl->rptr, 0x7fffffff, libc);  /* host threads waiting for progress see the fault */
}

static uint64_t check_header(uint64_t header, uint64_t available) {
  uint64_t op = header & 0xffff, n = header >> 16;
  if (op >= BG_NUM_OPCODES) return BG_FAULT_OPCODE;
  if (n < min_words[op] || n > available) return BG_FAULT_SIZE;
  return BG_OK;
}

static uint64_t run_packet(struct bg_ctl *ctl, const uint64_t *words, uint64_t mask, uint64_t pos, int in_indirect,
                           const struct bg_libc *libc);

/* ---- the address table: sorted [start, end) ranges and sorted entry points, swapped in by the host ---- */
struct bg_range { uint64_t start, end; };
static struct { uint32_t lock; const struct bg_range *ranges; uint64_t nranges; const uint64_t *entries; uint64_t nentries; } mmu;

static void mmu_lock(void) { while (__atomic_exchange_n(&mmu.lock, 1, __ATOMIC_ACQUIRE)) CPU_RELAX(); }
static void mmu_unlock(void) { __atomic_store_n(&mmu.lock, 0, __ATOMIC_RELEASE); }

/* 1 when [addr, addr + len) lies inside one registered range */
static int mmu_mapped(uint64_t addr, uint64_t len) {
  if (addr + len < addr) return 0;
  mmu_lock();
  uint64_t lo = 0, hi = mmu.nranges;      /* first range with start > addr */
  while (lo < hi) { uint64_t mid = (lo + hi) / 2; if (mmu.ranges[mid].start <= addr) lo = mid + 1; else hi = mid; }
  int ok = lo > 0 && addr + len <= mmu.ranges[lo - 1].end;
  mmu_unlock();
  return ok;
}

static int mmu_entry(uint64_t fn) {
  mmu_lock();
  uint64_t lo = 0, hi = mmu.nentries;
  while (lo < hi) { uint64_t mid = (lo + hi) / 2; if (mmu.entries[mid] < fn) lo = mid + 1; else hi = mid; }
  int ok = lo < mmu.nentries && mmu.entries[lo] == fn;
  mmu_unlock();
  return ok;
}

/* The host publishes new tables (it keeps them alive until the next call returns). */
void bg_host_mmu_set(const struct bg_range *ranges, uint64_t nranges, const uint64_t *entries, uint64_t nentries) {
  mmu_lock();
  mmu.ranges = ranges; mmu.nranges = nranges; mmu.entries = entries; mmu.nentries = nentries;
  mmu_unlock();
}

/* BG_OK, or the fault of the first operand that is not mapped memory / a known entry point */
static uint64_t check_operands(struct bg_ctl *ctl, const uint64_t *words, uint64_t mask, uint64_t pos) {
#define ARG(k) words[(pos + (k)) & mask]
#define NEED(a, n) do { if (!mmu_mapped((a), (n))) { ctl->fault_addr = (a); return BG_FAULT_ADDRESS; } } while (0)
  switch (ARG(0) & 0xffff) {
  case BG_EXEC: case BG_EXEC_MT:
    if (!mmu_entry(ARG(1))) { ctl->fault_addr = ARG(1); return BG_FAULT_ENTRY; }
    NEED(ARG(2), 8); break;
  case BG_COPY: if (ARG(3)) { NEED(ARG(1), ARG(3)); NEED(ARG(2), ARG(3)); } break;
  case BG_SIGNAL: case BG_WAIT: case BG_TIMESTAMP: NEED(ARG(1), 8); break;
  case BG_INDIRECT:
    if (ARG(2) >> 60) { ctl->fault_addr = ARG(1); return BG_FAULT_ADDRESS; }   /* nwords * 8 would wrap */
    NEED(ARG(1), ARG(2) * 8); break;
  }
  return BG_OK;
#undef NEED
#undef ARG
}

/* the packets of an INDIRECT buffer, one level deep */
static uint64_t run_indirect(struct bg_ctl *ctl, const uint64_t *ib, uint64_t nwords, const struct bg_libc *libc) {
  for (uint64_t pos = 0; pos < nwords; pos += ib[pos] >> 16) {
    __atomic_store_n(&ctl->ib_progress, pos + 1, __ATOMIC_RELAXED);
    uint64_t result = check_header(ib[pos], nwords - pos);
    if (result == BG_OK) result = run_packet(ctl, ib, ~(uint64_t)0, pos, 1, libc);
    if (result == BG_STOPPED) return result;
    if (result != BG_OK) {
      if (!LOAD(&ctl->fault)) set_fault(ctl, result, ib[pos], pos + 1, libc);
      return result;
    }
  }
  __atomic_store_n(&ctl->ib_progress, 0, __ATOMIC_RELAXED);
  return BG_OK;
}

/* ---- the team: helper threads that share the chunks of an EXEC_MT kernel with the worker ----
 * A job (fn, args, nchunks) is published under a new generation. Chunks are claimed from `ticket`, one 64-bit
 * word holding (generation << 32 | next chunk), by compare-and-swap: a claim succeeds only while the ticket
 * still carries the generation the claimer read the job under. A helper that read a job and was then
 * descheduled while the worker finished it and published the next one therefore cannot run a chunk of the new
 * job with the old function and arguments (its CAS fails on the generation), which a plain fetch-add on a
 * shared chunk counter allows. `done` counts finished chunks of the current job (the worker futex-waits on it);
 * the worker publishes a new job only once all chunks of the current one are done, so every increment of
 * `done` belongs to the current job. `owner` makes the team one job at a time when several command
 * processors run EXEC_MT at once (the one that does not get it runs its chunks alone). */
typedef void (*bg_kernel_t)(const uint64_t *args, int64_t chunk);
static struct {
  uint32_t generation, stop;       /* generation: futex word the helpers sleep on */
  uint64_t ticket;                 /* generation << 32 | next chunk to claim */
  uint32_t done, nchunks, helpers, owner;
  uint32_t active;                 /* threads running chunks now: the worker, helpers and waiting host threads */
  int64_t chunk_ns;                /* how long the first chunk of the current job to finish took (0: none yet) */
  uint32_t sleepers;               /* helpers asleep (or about to be) on `generation`: a new job wakes them */
  uint64_t fn, args;
  uint32_t fault_sig;              /* the first signal that stopped a chunk of the current job (0: none) */
  uint64_t fault_addr;
} team;

/* A helper or a waiting host thread joins the current job only while fewer than THREADS threads (the worker and its
 * helpers) run its chunks: a host thread that waits takes the place of a helper still asleep, and a helper that
 * wakes after that stays out. More runners than cores would share a CPU, and a chunk whose thread lost the CPU holds
 * up the whole kernel. */
static int join_team(void) {
  uint32_t a = LOAD(&team.active);
  do { if (a > LOAD(&team.helpers)) return 0; }
  while (!__atomic_compare_exchange_n(&team.active, &a, a + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
  return 1;
}

static void leave_team(void) { __atomic_sub_fetch(&team.active, 1, __ATOMIC_ACQ_REL); }

/* returns how many chunks this thread ran */
static uint32_t run_chunks(struct bg_guard *g, const struct bg_libc *libc) {
  uint64_t t = __atomic_load_n(&team.ticket, __ATOMIC_ACQUIRE);
  uint64_t gen = t >> 32;
  /* the job as published under `gen`; if it has been replaced since, every claim below fails */
  bg_kernel_t fn = (bg_kernel_t)__atomic_load_n(&team.fn, __ATOMIC_RELAXED);
  const uint64_t *args = (const uint64_t *)__atomic_load_n(&team.args, __ATOMIC_RELAXED);
  uint32_t n = __atomic_load_n(&team.nchunks, __ATOMIC_RELAXED), ran = 0;
  for (;;) {
    t = __atomic_load_n(&team.ticket, __ATOMIC_ACQUIRE);
    if ((t >> 32) != gen || (uint32_t)t >= n) return ran;
    /* acq_rel: the job reads above cannot move past a successful claim */
    if (!__atomic_compare_exchange_n(&team.ticket, &t, t + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) continue;
    ran++;
    int64_t t0 = __atomic_load_n(&team.chunk_ns, __ATOMIC_RELAXED) ? 0 : now_ns(libc);
    int sig = guarded_call(g, (uint64_t)fn, (uint64_t)args, (int64_t)(uint32_t)t);
    if (t0) {
      int64_t took = now_ns(libc) - t0, none = 0;
      __atomic_compare_exchange_n(&team.chunk_ns, &none, took > 0 ? took : 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    }
    if (sig) {
      uint32_t none = 0;
      if (__atomic_compare_exchange_n(&team.fault_sig, &none, (uint32_t)sig, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        __atomic_store_n(&team.fault_addr, g->addr, __ATOMIC_RELEASE);
    }
    if (__atomic_add_fetch(&team.done, 1, __ATOMIC_ACQ_REL) == n) futex_wake(&team.done, 0x7fffffff, libc);
  }
}

/* A host thread that waits for the device runs chunks of the job in flight, as a BLAS's calling thread computes its
 * share: it is on a CPU anyway (spinning), and on a machine with few cores the kernel's chunks otherwise share that
 * CPU with its spin. 1 if it ran any. Without a guard slot it does not help (a fault would end the process). Only
 * once a chunk of the job finished, and only while its wait has HELP_MARGIN times that chunk's time left (left_ns < 0:
 * no timeout): a kernel that never returns must leave the host free to time out and report it, not take the host
 * with it (a chunk that hangs only after others finished can still do that). */
#define HELP_MARGIN 64
static int host_help(struct bg_guard **g, int64_t left_ns, const struct bg_libc *libc) {
  uint64_t t = LOAD(&team.ticket);
  if (!LOAD(&team.owner) || (uint32_t)t >= LOAD(&team.nchunks)) return 0;
  int64_t took = __atomic_load_n(&team.chunk_ns, __ATOMIC_RELAXED);
  if (!took || (left_ns >= 0 && took > left_ns / HELP_MARGIN)) return 0;
  if (!*g && !(*g = claim_guard(libc))) return 0;
  if (!join_team()) return 0;
  uint32_t ran = run_chunks(*g, libc);
  leave_team();
  return ran != 0;
}

/* the chunks one after the other: 0, or the signal that stopped one (*addr: where) */
static int exec_serial(uint64_t fn, uint64_t args, uint64_t nchunks, struct bg_guard *g, uint64_t *addr) {
  for (uint64_t c = 0; c < nchunks; c++) {
    int sig = guarded_call(g, fn, args, (int64_t)c);
    if (sig) { *addr = g->addr; return sig; }
  }
  return 0;
}

static int exec_mt(uint64_t fn, uint64_t args, uint64_t nchunks, struct bg_guard *g, uint64_t *addr,
                   const struct bg_libc *libc) {
  if (nchunks <= 1 || nchunks > 0xffffffffu || !LOAD(&team.helpers) ||
      __atomic_exchange_n(&team.owner, 1, __ATOMIC_ACQUIRE)) {
    return exec_serial(fn, args, nchunks, g, addr);
  }
  __atomic_store_n(&team.fault_sig, 0, __ATOMIC_RELAXED);
  uint32_t gen = __atomic_load_n(&team.generation, __ATOMIC_RELAXED) + 1;
  __atomic_store_n(&team.fn, fn, __ATOMIC_RELAXED);
  __atomic_store_n(&team.args, args, __ATOMIC_RELAXED);
  __atomic_store_n(&team.nchunks, (uint32_t)nchunks, __ATOMIC_RELAXED);
  __atomic_store_n(&team.done, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&team.chunk_ns, 0, __ATOMIC_RELAXED);
  __atomic_add_fetch(&team.active, 1, __ATOMIC_ACQ_REL);   /* the worker runs chunks: counted before anyone can join */
  __atomic_store_n(&team.ticket, (uint64_t)gen << 32, __ATOMIC_SEQ_CST);   /* releases the job fields */
  __atomic_store_n(&team.generation, gen, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&team.sleepers, __ATOMIC_SEQ_CST)) futex_wake(&team.generation, 0x7fffffff, libc);   /* (a syscall) */
  run_chunks(g, libc);
  leave_team();
  uint32_t d;
  for (uint32_t i = 1; (d = LOAD(&team.done)) < nchunks; i++) {
    if (i < 4096) CPU_RELAX(); else futex_wait(&team.done, d, FUTEX_SLICE_NS, libc);
  }
  int sig = (int)LOAD(&team.fault_sig);
  if (sig) *addr = LOAD(&team.fault_addr);
  __atomic_store_n(&team.owner, 0, __ATOMIC_RELEASE);
  return sig;
}

/* A helper thread (started from Python; cffi releases the GIL): run chunks of each new job until stopped. */
void bg_helper_run(const struct bg_libc *libc) {
  struct bg_guard *guard = claim_guard(libc);
  __atomic_add_fetch(&team.helpers, 1, __ATOMIC_SEQ_CST);
  uint32_t seen = LOAD(&team.generation);
  int ran = 0;   /* a job ran since the last sleep */
  while (!LOAD(&team.stop)) {
    uint32_t g = LOAD(&team.generation);
    if (g == seen) {
      /* after a job, spin (yielding: the worker and the host thread may need this core) for a while, then sleep.
       * Woken with nothing new (the timeout), sleep again at once: an idle helper must not take a CPU every so
       * often from the host and the worker. exec_mt wakes us after it publishes a job (futex_wait returns at once
       * if the generation already moved), and bg_helpers_stop wakes us to stop. */
      if (ran) {
        int64_t start = now_ns(libc), t = start;
        for (uint32_t i = 1; t - start < IDLE_SPIN_NS && (g = LOAD(&team.generation)) == seen && !LOAD(&team.stop); i++)
          t = spin_step(i, t, libc);
        ran = 0;
      }
      if (g == seen) {
        /* Dekker-style with exec_mt: count ourselves asleep, then the futex checks the generation (both seq_cst), so
         * either exec_mt sees a sleeper and wakes it or the futex sees the new generation and returns at once */
        __atomic_add_fetch(&team.sleepers, 1, __ATOMIC_SEQ_CST);
        futex_wait(&team.generation, seen, IDLE_SLEEP_NS, libc);
        __atomic_sub_fetch(&team.sleepers, 1, __ATOMIC_SEQ_CST);
        continue;
      }
    }
    seen = g;
    if (join_team()) { run_chunks(guard, libc); leave_team(); }
    ran = 1;
  }
  __atomic_sub_fetch(&team.helpers, 1, __ATOMIC_SEQ_CST);
  release_guard(guard);
}

void bg_helpers_stop(const struct bg_libc *libc) {
  __atomic_store_n(&team.stop, 1, __ATOMIC_SEQ_CST);
  futex_wake(&team.generation, 0x7fffffff, libc);
}

/* Execute the (checked) packet at words[pos & mask]; returns BG_OK, a fault code or BG_STOPPED. */
static uint64_t run_packet(struct bg_ctl *ctl, const uint64_t *words, uint64_t mask, uint64_t pos, int in_indirect,
                           const struct bg_libc *libc) {
#define ARG(k) words[(pos + (k)) & mask]
  if (LOAD(&ctl->checked)) { uint64_t bad = check_operands(ctl, words, mask, pos); if (bad != BG_OK) return bad; }
  switch (ARG(0) & 0xffff) {
  case BG_NOP: return BG_OK;
  case BG_EXEC: case BG_EXEC_MT: {
    struct bg_guard *g = (struct bg_guard *)LOAD(&ctl->guard);
    uint64_t addr = 0;
    int sig = (ARG(0) & 0xffff) == BG_EXEC ? guarded_call(g, ARG(1), ARG(2), 0) : exec_mt(ARG(1), ARG(2), ARG(3), g, &addr, libc);
    if (!sig) return BG_OK;
    if ((ARG(0) & 0xffff) == BG_EXEC) addr = g->addr;
    ctl->fault_signal = (uint64_t)sig;
    ctl->fault_addr = addr;
    return BG_FAULT_KERNEL;
  }
  case BG_COPY: libc->memcpy((void *)ARG(1), (const void *)ARG(2), (size_t)ARG(3)); return BG_OK;
  case BG_SIGNAL:
    STORE((uint64_t *)ARG(1), ARG(2));
    futex_wake((const void *)ARG(1), 0x7fffffff, libc);
    return BG_OK;
  case BG_WAIT:
    return wait_ge((const uint64_t *)ARG(1), ARG(2), -1, WAIT_SPIN_NS, NULL, &ctl->stop, NULL, libc) == BG_WAIT_DONE
               ? BG_OK : BG_STOPPED;
  case BG_TIMESTAMP: STORE((uint64_t *)ARG(1), (uint64_t)now_ns(libc)); return BG_OK;
  case BG_BARRIER: __atomic_thread_fence(__ATOMIC_SEQ_CST); return BG_OK;
  case BG_INDIRECT:
    if (in_indirect) return BG_FAULT_NESTED_INDIRECT;
    return run_indirect(ctl, (const uint64_t *)ARG(1), ARG(2), libc);
  }
  return BG_FAULT_OPCODE;
#undef ARG
}

static uint32_t current_cpu(const struct bg_libc *libc) {
  uint32_t cpu = 0;
  libc->syscall(SYS_GETCPU, (long)&cpu, 0L, 0L);
  return cpu;
}

#define MAX_CPU_WORDS 16   /* CPU masks of up to 1024 CPUs */

struct idle_state {
  int64_t last_gap;       /* the last idle gap (idle start to the next doorbell) when short, else 0 */
  int64_t last_nudge;     /* when leave_cpu last ran */
  long mask_bytes;        /* > 0 while this thread runs restricted: the size of `mask`, its own CPU mask */
  uint64_t mask[MAX_CPU_WORDS];
};

/* The worker spins on the CPU the host thread runs on: it takes that CPU's time from the host. Measured: an eager
 * loop ran ~15% slower for as long as it lasted, and the scheduler seldom separated them (a futex wake places the
 * woken thread beside its waker). So while it spins the worker runs on the other CPUs it may use (the kernel moves
 * it at once); it gets its own CPU mask back before it sleeps (restore_cpus). */
static void leave_cpu(struct idle_state *st, uint32_t cpu, const struct bg_libc *libc) {
  uint64_t mask[MAX_CPU_WORDS], others[MAX_CPU_WORDS];
  long n = st->mask_bytes;
  if (n > 0) libc->memcpy(mask, st->mask, (size_t)n);
  else n = libc->syscall(SYS_SCHED_GETAFFINITY, 0L, (long)sizeof(mask), (long)mask);
  if (n <= 0 || n % 8 || (uint64_t)cpu >= 8u * (uint64_t)n || !((mask[cpu / 64] >> (cpu % 64)) & 1)) return;
  int count = 0;
  for (long k = 0; k < n / 8; k++) { others[k] = mask[k]; count += __builtin_popcountll(mask[k]); }
  if (count < 2) return;
  others[cpu / 64] &= ~(1ull << (cpu % 64));
  if (libc->syscall(SYS_SCHED_SETAFFINITY, 0L, n, (long)others) != 0) return;
  if (st->mask_bytes <= 0) { libc->memcpy(st->mask, mask, (size_t)n); st->mask_bytes = n; }
}

static void restore_cpus(struct idle_state *st, const struct bg_libc *libc) {
  if (st->mask_bytes <= 0) return;
  libc->syscall(SYS_SCHED_SETAFFINITY, 0L, st->mask_bytes, (long)st->mask);
  st->mask_bytes = 0;
}

/* Nothing to do: spin a while, then sleep on wptr until the host's doorbell. How long: 4 times the last idle gap
 * when that was short, so an eager host loop whose Python work between submissions takes longer than IDLE_SPIN_NS
 * still finds the worker awake (a futex wake costs the host ~10 us); after a long gap, IDLE_SPIN_NS. Spinning
 * yields the CPU every SPIN_YIELD_EVERY pauses, and leaves the host's CPU when it finds itself on it. */
static void idle(struct bg_ctl *ctl, uint64_t rptr, struct idle_state *st, const struct bg_libc *libc) {
  int64_t spin = 4 * st->last_gap;
  if (spin < IDLE_SPIN_NS) spin = IDLE_SPIN_NS;
  if (spin > IDLE_SPIN_MAX_NS) spin = IDLE_SPIN_MAX_NS;
  int64_t start = now_ns(libc), t = start;
  for (uint32_t i = 1; t - start < spin; i++) {
    if (LOAD(&ctl->wptr) != rptr || LOAD(&ctl->stop)) { st->last_gap = now_ns(libc) - start; return; }
    t = spin_step(i, t, libc);
    if (i % SPIN_YIELD_EVERY == 0 && t - st->last_nudge > NUDGE_EVERY_NS) {   /* (at each sched_yield) */
      uint32_t host = LOAD(&ctl->host_cpu);
      if (host && current_cpu(libc) == host - 1) { leave_cpu(st, host - 1, libc); st->last_nudge = t; }
    }
  }
  restore_cpus(st, libc);
  /* Dekker-style with bg_host_doorbell: store sleeping, then load wptr (both seq_cst), so either
   * we see the new wptr or the host sees sleeping == 1 and wakes us. */
  __atomic_store_n(&ctl->sleeping, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&ctl->wptr, __ATOMIC_SEQ_CST) == rptr && !LOAD(&ctl->stop))
    futex_wait(&ctl->wptr, (uint32_t)rptr, IDLE_SLEEP_NS, libc);
  __atomic_store_n(&ctl->sleeping, 0, __ATOMIC_RELAXED);
  int64_t gap = now_ns(libc) - start;
  st->last_gap = gap <= IDLE_SPIN_MAX_NS / 2 ? gap : 0;   /* long: the host paused, the next spin is the shortest */
}

static void worker_loop(struct bg_ctl *ctl, uint64_t *ring, uint64_t ring_words, const struct bg_libc *libc);

void bg_worker_run(struct bg_ctl *ctl, uint64_t *ring, uint64_t ring_words, const struct bg_libc *libc) {
  struct bg_guard *g = claim_guard(libc);        /* this thread's kernels stop at a fault, not the process */
  STORE(&ctl->guard, (uint64_t)g);
  worker_loop(ctl, ring, ring_words, libc);
  STORE(&ctl->guard, 0);
  release_guard(g);
}

static void worker_loop(struct bg_ctl *ctl, uint64_t *ring, uint64_t ring_words, const struct bg_libc *libc) {
  const uint64_t mask = ring_words - 1;
  unsigned quarter_shift = 0;  /* wake rptr waiters whenever another quarter of the ring is free */
  while ((4ull << quarter_shift) < ring_words) quarter_shift++;
  uint64_t rptr = LOAD(&ctl->rptr);
  struct idle_state st = {0, -NUDGE_EVERY_NS, 0, {0}};
  while (!LOAD(&ctl->stop) && !LOAD(&ctl->fault)) {
    uint64_t wptr = LOAD(&ctl->wptr);
    if (rptr == wptr) { idle(ctl, rptr, &st, libc); continue; }
    while (rptr != wptr && !LOAD(&ctl->stop)) {
      uint64_t header = ring[rptr & mask];
      __atomic_store_n(&ctl->last_header_rptr, rptr, __ATOMIC_RELAXED);
      uint64_t result = check_header(header, wptr - rptr);
      if (result == BG_OK) result = run_packet(ctl, ring, mask, rptr, 0, libc);
      if (result == BG_STOPPED) return;
      if (result != BG_OK) {
        if (!LOAD(&ctl->fault)) set_fault(ctl, result, header, 0, libc);
        return;
      }
      uint64_t next = rptr + (header >> 16);
      /* seq_cst pairs with the seq_cst increment of rptr_waiters in bg_host_wait_rptr */
      __atomic_store_n(&ctl->rptr, next, __ATOMIC_SEQ_CST);
      if (__atomic_load_n(&ctl->rptr_waiters, __ATOMIC_SEQ_CST) &&
          (next == wptr || (next >> quarter_shift) != (rptr >> quarter_shift)))
        futex_wake(&ctl->rptr, 0x7fffffff, libc);
      rptr = next;
    }
  }
}

/* ---- host side: called from Python through cffi, which releases the GIL ---- */

/* Publish wptr; wake the worker if it sleeps. */
void bg_host_doorbell(struct bg_ctl *ctl, uint64_t wptr, const struct bg_libc *libc) {
  __atomic_store_n(&ctl->host_cpu, current_cpu(libc) + 1, __ATOMIC_RELAXED);
  __atomic_store_n(&ctl->wptr, wptr, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&ctl->sleeping, __ATOMIC_SEQ_CST)) futex_wake(&ctl->wptr, 1, libc);
}

void bg_host_stop(struct bg_ctl *ctl, const struct bg_libc *libc) {
  __atomic_store_n(&ctl->stop, 1, __ATOMIC_SEQ_CST);
  futex_wake(&ctl->wptr, 1, libc);
}

/* Addresses from the host come as integers (uint64 words, as in packets). */

/* Block until the uint64 at addr is >= value; BG_WAIT_DONE, BG_WAIT_TIMEOUT, or BG_WAIT_ABORTED when the
 * uint64 at fault_addr (0: none) becomes nonzero. */
int bg_host_wait_value(uint64_t addr, uint64_t value, int64_t timeout_ns, int64_t spin_ns, uint64_t fault_addr,
                       const struct bg_libc *libc) {
  struct bg_guard *g = 0;
  int result = wait_ge((const uint64_t *)addr, value, timeout_ns, spin_ns, (const uint64_t *)fault_addr, NULL, &g, libc);
  release_guard(g);
  return result;
}

/* Block until the worker's rptr reaches `target` (woken when the ring empties or a quarter frees up). */
int bg_host_wait_rptr(struct bg_ctl *ctl, uint64_t target, int64_t timeout_ns, int64_t spin_ns,
                      const struct bg_libc *libc) {
  __atomic_add_fetch(&ctl->rptr_waiters, 1, __ATOMIC_SEQ_CST);
  struct bg_guard *g = 0;
  int result = wait_ge(&ctl->rptr, target, timeout_ns, spin_ns, &ctl->fault, &ctl->stop, &g, libc);
  release_guard(g);
  __atomic_sub_fetch(&ctl->rptr_waiters, 1, __ATOMIC_SEQ_CST);
  return result;
}

long bg_host_futex_wait(uint64_t addr, uint32_t expected, int64_t timeout_ns, const struct bg_libc *libc) {
  return futex_wait((const void *)addr, expected, timeout_ns, libc);
}

long bg_host_futex_wake(uint64_t addr, int count, const struct bg_libc *libc) {
  return futex_wake((const void *)addr, count, libc);
}
