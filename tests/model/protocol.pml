/*
 * The lock and slot protocol of django-exclusive-jobs, as a Promela model for spin.
 *
 * Checked by scripts/model.sh (and tests/test_model.py); explained in docs/model.md.
 *
 * What runs here: NS servers (up to 3), each firing triggers (a cron line, the
 * scheduler) for NJ jobs (up to 2), each with slots 0..NK-1 (P ticks apart). For each
 * start a server does what Run.start, Run.call and Run.finish do (runner.py): take the
 * job's lease (sql.py "take"; under ALLOW_ALL the lease of the slot's own lock), claim the slot (history.py claim: look, record missed
 * and skipped slots, insert the run row; a job's first claim renews its lease and
 * inserts in one transaction, history._under_lease), run the job (which may write once
 * to a fenced resource), release (sql.py "release") and record the end (history.py
 * record_end).
 * Each server has a keep-alive thread (keepalive.py: renew, and a watchdog that gives
 * the lock up shortly before the lease could end when no renewal got through). A
 * nemesis crashes or pauses holders (a crashed server never acts again and its lease
 * runs out; a paused one resumes later, still believing what it believed), and an
 * operator force-releases a lock (models.py JobLockQuerySet.force_release).
 *
 * One database clock, `dbnow`, advances by ticks (the Clock process). Every lease is
 * written and compared on it, as every statement in sql.py does. Every atomic step
 * below is ONE SQL statement (its comment names it and its WHERE clause) or ONE local
 * decision of a process (its comment names the function). A step is an atomic { }
 * or a d_step { } (which pan runs as one transition, faster; it may not jump out, so
 * a step that ends in a goto is an atomic { } around a d_step { }).
 *
 * Properties (assertions, checked in every reachable state; see INVARIANTS and PROP):
 *  (a) for each job, at most one holder whose lease is valid: the expiry the database
 *      returned to it (take, renew) not yet reached on the database clock, and not
 *      revoked by its own release or an operator's force-release. Crashed and paused
 *      holders count too: the database's promise does not depend on them.
 *  (b) the fenced resource refuses a write whose token is below the highest it has
 *      seen, and keeps the highest: accepted writes never go down; and every take gets
 *      a token no other holder of the job has, so two servers' writes never interleave
 *      out of order.
 *  (c) each (job, slot) starts its job at most once.
 *  (d) every slot a claim passed (between the newest row it found and the slot it
 *      claims) has a row once that claim went through (run, missed or skipped): never
 *      silently dropped; and no slot is without a row between two slots with a row,
 *      that is between the job's first row and a slot a claim passed (the first-run
 *      gap, docs/model.md: a first claim stalled past its lease could write its row
 *      after a later holder's first run).
 *  (f) keep-alive's watchdog: a holder neither paused nor force-released since its
 *      take, and not yet told the lock is lost, holds a valid lease. (A paused one may
 *      not: that is what fencing is for.)
 *  (e) no invalid end state (deadlock): spin's own check.
 *
 * What the model abstracts away (read this before trusting it further than it goes):
 *  - One clock: the database's. The client's estimate of it (the monotonic deadline,
 *    `started + ttl`, lock.py) is exact here: each statement is sent and runs at one
 *    tick, so network delay and the drift of app servers' clocks are not modelled,
 *    nor SLOT_TOLERANCE and the scheduler's `not_before`: a start serves
 *    slot_at(acquired_at). A renewal runs in one step (no renewal still on its way
 *    when the watchdog gives up).
 *  - Time is whole ticks: a lease of TTL = 2 ticks, a watchdog margin of 1 tick, slots
 *    P = 1 tick apart, the clock stops at MAXT. Real margins are ttl/20 and renewals
 *    come every ttl/3; only the order of these moments matters here.
 *  - min_hold = 0 (a release ends the lease at once): scheduled jobs rely on slots.
 *    catch_up="latest" only, and overlap="skip" (BUFFER=0) or "buffer_one" and
 *    "cancel_other" (BUFFER=1: their claims plan alike; cancel_other's request that
 *    the running job stop is a job that ends early, which the model already lets any
 *    job do), "buffer_all" (BUFFER=2: each slot that came during the run runs, one
 *    start after another, the oldest first), or "allow_all" (ALLOW_ALL=1, one job: each slot takes a lock of its own,
 *    slot_locks.py; no fenced write, since runs of slots that overlap may share a
 *    token; each slot's lock starts at token 0 here, not above the job's history):
 *    no retries (attempt is always 1), no other catch_up policy, no run now,
 *    backfill, operator pause, override or jitter.
 *  - close_abandoned (an older token's running row marked lost) is left out: the plan
 *    reads a running row and a lost row with no end alike. So is the read after a
 *    take that did not win (it names the holder for the log line), and the
 *    get_or_create of a row never prepared (prepare_locks makes each job's row ahead).
 *  - Database errors other than a renewal that gets no answer are not modelled
 *    (dropped connections and their retries, busy timeouts), nor a database that loses
 *    committed writes, whose clock jumps, or whose rows are deleted by hand.
 *  - The job is a child program: told to stop when the lock is lost, it may still make
 *    its one write before it stops (SIGTERM, then --grace). ensure_held() (sql.py
 *    "check") is not modelled: it is the same kind of look-then-act as Run._may_start.
 *  - A job's first claim writes only its run row here: the paused row and the slots an
 *    override replaced, which history._under_lease writes in the same transaction, are
 *    not modelled.
 *  - Bounds: see below and scripts/model.sh, which checks several bounds: 3 servers
 *    and 2 jobs without faults; 3 servers, 1 job, a crash or a pause and a
 *    force-release; 2 servers starting twice each with a fault, with 3 slots and with
 *    4 (NK=4: a missed slot newer than a skipped one); the same under buffer_all and
 *    allow_all; 1 server starting three times under buffer_all with 5 slots (a missed
 *    slot newer than two buffered ones); and (--long) 3 servers, 2 jobs and one crash,
 *    pause or force-release in all (DISTURBANCES), and buffer_all with 2 servers
 *    starting twice and 5 slots.
 *
 * Mutants (spin -DMUTANT_...; scripts/model.sh requires a counterexample for each):
 *  MUTANT_TAKE_IGNORES_EXPIRY         the take without "AND (expires_at IS NULL OR
 *                                     expires_at <= now)": refuted by (a)
 *  MUTANT_RELEASE_NOT_HOLDER_CHECKED  the release without "AND token = %s AND
 *                                     released_at IS NULL": refuted by (a)
 *  MUTANT_CLAIM_NOT_UNIQUE            JobRun without its unique (name, slot, attempt):
 *                                     the insert always inserts: refuted by (c)
 *  MUTANT_NO_WATCHDOG                 keep-alive without its watchdog: renewals that
 *                                     get no answer leave the job running past its
 *                                     lease: refuted by (f)
 *  MUTANT_FIRST_UNGUARDED             a job's first claim inserts without renewing its
 *                                     lease in the same transaction (before the fix of
 *                                     the first-run gap): refuted by (d)
 *  MUTANT_CLAIM_WRITES_APART          a claim's missed rows, skipped rows and run row
 *                                     each in a statement of its own (before the fix):
 *                                     refuted by (d) with four slots
 *  MUTANT_BUFFER_ALL_RECORDS_AHEAD    under BUFFER=2 (buffer_all), a claim that records a
 *                                     slot missed leaves older buffered slots for later
 *                                     (before the fix): refuted by (d)
 *  MUTANT_SLOTS_OUT_OF_TURN           under ALLOW_ALL, first claims of two slots not put
 *                                     in turn (history._in_turn; before the fix): the
 *                                     older slot's row lands after the newer one's:
 *                                     refuted by (d)
 * Not a mutant:
 *  REACH_BUFFERED                     with BUFFER=1: an assertion that a buffered slot
 *                                     never starts, which spin must refute (the
 *                                     model does reach buffer_one's runs)
 *  REACH_LEFT                         with BUFFER=2: an assertion that no start runs a
 *                                     slot a buffer_all claim left for later, which
 *                                     spin must refute
 */

/* ---- bounds ---------------------------------------------------------------------- */
#ifndef NS
#define NS 3            /* servers (1 to 3) */
#endif
#ifndef NJ
#define NJ 2            /* jobs (1 or 2) */
#endif
#ifndef NK
#define NK 3            /* slots per job (3 to 5): slot k begins at tick k*P */
#endif
#ifndef P
#define P 1             /* ticks per slot (the job's interval) */
#endif
#ifndef TTL
#define TTL 2           /* ticks of lease */
#endif
#define MARGIN 1        /* watchdog_margin(ttl): give up this long before the deadline */
#ifndef MAXT
#define MAXT (NK*P + 1) /* the clock stops here */
#endif
#ifndef STARTS
#define STARTS 1        /* starts (triggers: cron line, scheduler) per server */
#endif
#ifndef FAULTS
#define FAULTS 1        /* crashes and pauses, in all */
#endif
#ifndef FORCE
#define FORCE 1         /* operator force-releases, in all */
#endif
#ifndef BUFFER
#define BUFFER 0        /* overlap: 0 "skip"; 1 "buffer_one" and "cancel_other"; 2 "buffer_all" */
#endif
#ifndef ALLOW_ALL
#define ALLOW_ALL 0     /* overlap="allow_all": a lock per slot (slot_locks.py) */
#endif
#if ALLOW_ALL && (NJ != 1 || BUFFER || NK > 4)
#error "ALLOW_ALL models one job, overlap=allow_all alone, and at most 4 slots (locks)"
#endif
#if ALLOW_ALL
#define NL NK           /* locks: one per slot of the one job (NAME@SLOT) */
#else
#define NL NJ           /* locks: one per job (NAME) */
#endif
#ifndef DISTURBANCES
#define DISTURBANCES (FAULTS + FORCE) /* crashes, pauses and force-releases, in all */
#endif

#define NOBODY 255
/* A JobRun row's status, as the claim reads it (status.py) */
#define NONE 0          /* no row */
#define RUNNING 1       /* running, or lost with no known end */
#define ENDED 2         /* ended and recorded its end: succeeded, failed, lost by itself */
#define MISSED 3
#define SKIPPED 4

/* A time at or before dbnow is stored as 0: every comparison the protocol makes with it
   (expires_at <= now, expires_at > now, now >= deadline) gives the same answer from now
   on, since the clock only moves forward. One past time instead of many keeps the state
   space small. */
#define PAST(x) if :: (x) <= dbnow -> x = 0 :: else fi

/* ---- the database ------------------------------------------------------------------ */
byte dbnow;                    /* the database's clock: STATEMENT_TIMESTAMP() */
/* JobLock, one row per job (under ALLOW_ALL: per slot), made free ahead by prepare_locks
   (token 0, expires_at NULL, which the take treats as a lease that is over: 0 here) */
byte ltoken[NL];
byte lexpires[NL];
bit lreleased[NL];
/* JobRun, unique (name, slot, attempt); attempt is always 1 here */
byte rstatus[NJ*NK];
/* what history.py _ran and catchup._overran read from an ENDED row (started_at,
   duration): the slots that began in (started_at, started_at + duration] if the run
   lasted its interval or more, as a bit mask (bit k: slot k), else 0 */
byte rduring[NJ*NK];
/* the fenced resource, one per job: it keeps the highest token it has seen */
byte fence[NJ];

/* ---- each server's lock, as its process and keep-alive thread see it ---------------- */
byte lockof[NS];               /* its current lock: its job's (ALLOW_ALL: its slot's) */
byte token[NS];                /* lock.token */
byte deadline[NS];             /* lock._deadline: when the lease may end, locally */
bit holding[NS];               /* from a won take to its release */
bit lost[NS];                  /* lock.lost_reason set (lock_lost sent, job told to stop) */
bit paused[NS];                /* SIGSTOP: the process does nothing until resumed */
bit crashed[NS];               /* kill -9: never acts again */

/* ---- ghosts: what the properties are judged by (no code has them) ------------------- */
byte lease[NS];                /* expiry the database last granted this server's token */
bit pausedsince[NS];           /* paused since its take */
bit revoked[NS];               /* force-released since its take */
byte starts[NJ*NK];            /* how many times each (job, slot) started its job */
byte owed[NJ];                 /* (d): bit k: a claim passed slot k after a row before it */
byte fired;                    /* how many servers have fired a first trigger (symmetry) */
#ifdef REACH_LEFT
byte left_for_later;           /* buffer_all: slots a claim left for later starts */
#endif
byte faults = FAULTS;
byte forces = FORCE;

#define ROW(j, k) rstatus[(j)*NK + (k)]
/* The claim went through: what it passed is owed a row (d) */
#define PASS() owed[j] = owed[j] | owe; owe = 0
#define ACTIVE(me) (!paused[me])
/* history._under_lease: the claim's writes go under its lease: the job's first claim */
#ifdef MUTANT_FIRST_UNGUARDED
#define UNDER_LEASE 0
#else
#define UNDER_LEASE first
#endif
/* lock.renew: not found lost locally (else LockLost, nothing sent), and sql.py "renew"
   finds its row: WHERE name = j AND token = mine AND released_at IS NULL AND
   expires_at > now */
#define RENEWS(me, jj) (!lost[me] && ltoken[jj] == token[me] && !lreleased[jj] \
                        && lexpires[jj] > dbnow)
#define VALID(s) (lease[s] > dbnow)

/* The invariants (a), (d) and (f), asserted after every step that can change them
   (written out for each server, job and slot: one expression is one step for pan). */
#if NS == 1
#define FORALL_S(F, x) (F(0, x))
#define COUNT_S(F, x) (F(0, x))
#elif NS == 2
#define FORALL_S(F, x) (F(0, x) && F(1, x))
#define COUNT_S(F, x) (F(0, x) + F(1, x))
#else
#define FORALL_S(F, x) (F(0, x) && F(1, x) && F(2, x))
#define COUNT_S(F, x) (F(0, x) + F(1, x) + F(2, x))
#endif
#if NJ == 1
#define FORALL_J(F) (F(0))
#else
#define FORALL_J(F) (F(0) && F(1))
#endif
#if NL == 1
#define FORALL_L(F) (F(0))
#elif NL == 2
#define FORALL_L(F) (F(0) && F(1))
#elif NL == 3
#define FORALL_L(F) (F(0) && F(1) && F(2))
#else
#define FORALL_L(F) (F(0) && F(1) && F(2) && F(3))
#endif
#if NK == 2
#define FORALL_K(F, j) (F(j, 0) && F(j, 1))
#elif NK == 3
#define FORALL_K(F, j) (F(j, 0) && F(j, 1) && F(j, 2))
#elif NK == 4
#define FORALL_K(F, j) (F(j, 0) && F(j, 1) && F(j, 2) && F(j, 3))
#else
#define FORALL_K(F, j) (F(j, 0) && F(j, 1) && F(j, 2) && F(j, 3) && F(j, 4))
#endif

/* (a) for lock l, at most one server holding it with a valid lease */
#define HOLDS_VALID(s, l) (holding[s] && lockof[s] == (l) && VALID(s))
#define ONE_VALID(j) (COUNT_S(HOLDS_VALID, j) <= 1)
/* (d) every slot a claim passed after a row before it (owed) has a row */
#define PAID(j, k) (!(owed[j] & (1 << (k))) || ROW(j, k) != NONE)
#define ALL_PAID(j) FORALL_K(PAID, j)
/* (d) no slot without a row between two slots with a row: between the job's first row
   and a slot a claim passed (a row at slot k means a claim for slot k or a later one
   went through: missed and skipped rows are of slots before the claim's, its run row
   of its own or, buffered, of one before it). */
#define HAS(j, k) (ROW(j, k) != NONE)
#if NK == 3
#define NO_GAP(j) (!(HAS(j, 0) && !HAS(j, 1) && HAS(j, 2)))
#elif NK == 4
#define NO_GAP(j) (!(HAS(j, 0) && !HAS(j, 1) && (HAS(j, 2) || HAS(j, 3))) \
                   && !((HAS(j, 0) || HAS(j, 1)) && !HAS(j, 2) && HAS(j, 3)))
#elif NK == 5
#define NO_GAP(j) (!(HAS(j, 0) && !HAS(j, 1) && (HAS(j, 2) || HAS(j, 3) || HAS(j, 4))) \
                   && !((HAS(j, 0) || HAS(j, 1)) && !HAS(j, 2) && (HAS(j, 3) || HAS(j, 4))) \
                   && !((HAS(j, 0) || HAS(j, 1) || HAS(j, 2)) && !HAS(j, 3) && HAS(j, 4)))
#else
#define NO_GAP(j) 1
#endif
/* (b) every take gets a token of its own: no other holder of job j has this one */
#define OWN_TOKEN(s, me) ((s) == (me) || !holding[s] || lockof[s] != l || token[s] != token[me])
/* (f) the watchdog: a holder neither paused nor force-released since its take, and
   not yet told the lock is lost, has a valid lease */
#define WATCHED(s, x) (!(holding[s] && !crashed[s] && !lost[s] && !pausedsince[s] \
                         && !revoked[s]) || VALID(s))

/* An assertion that says which property it is when the trail is replayed */
#define PROP(cond, text) if :: !(cond) -> printf(text) :: else fi; assert(cond)
/* The invariants, at the end of each step (inside its d_step) */
#define INVARIANTS \
    PROP(FORALL_L(ONE_VALID), "MSC: VIOLATED (a): two servers hold one job with valid leases\n"); \
    PROP(FORALL_J(ALL_PAID), "MSC: VIOLATED (d): a slot a claim passed has no row\n"); \
    PROP(FORALL_J(NO_GAP), "MSC: VIOLATED (d): a slot between two slots with a row has none\n"); \
    PROP(FORALL_S(WATCHED, 0), "MSC: VIOLATED (f): a live, unpaused holder runs on past its lease\n")

/* ---- the clock ------------------------------------------------------------------------ */
/* It may not pass the moment a live holder's watchdog must act (keepalive.py
   KeepAlive._watch wakes at deadline - margin): the watchdog is a thread that runs
   unless its process is paused or dead. */
#define DUE(s) (holding[s] && !lost[s] && !paused[s] && !crashed[s] \
                && dbnow + MARGIN >= deadline[s])
#ifdef MUTANT_NO_WATCHDOG
#define WATCHDOG_DUE 0
#elif NS == 1
#define WATCHDOG_DUE DUE(0)
#elif NS == 2
#define WATCHDOG_DUE (DUE(0) || DUE(1))
#else
#define WATCHDOG_DUE (DUE(0) || DUE(1) || DUE(2))
#endif

active proctype Clock() {
end:
    do
    :: d_step { dbnow < MAXT && !WATCHDOG_DUE ->
        dbnow++;
        printf("MSC: ---- t=%d\n", dbnow);
        PAST(lease[0]); PAST(deadline[0]);
#if NS > 1
        PAST(lease[1]); PAST(deadline[1]);
#endif
#if NS > 2
        PAST(lease[2]); PAST(deadline[2]);
#endif
        PAST(lexpires[0]);
#if NL > 1
        PAST(lexpires[1]);
#endif
#if NL > 2
        PAST(lexpires[2]);
#endif
#if NL > 3
        PAST(lexpires[3]);
#endif
        INVARIANTS }
    od
}

/* ---- the statements a server sends ------------------------------------------------------ */

/* sql.py "take": UPDATE joblock SET token = token + 1, host = me, acquired_at = now,
   expires_at = now + ttl, released_at = NULL
   WHERE name = j AND (expires_at IS NULL OR expires_at <= now)
   A row back: won, leave the triggers' loop (break); else skipped (held by another;
   the read that names the holder only informs the log line). */
inline TAKE() {
    d_step {
        if :: left == STARTS -> fired++ :: else fi;
        left--;
        /* allow_all: the slot's lock (Run._slot_of_lock picks it before the take; here
           at the take's tick: a start that picked it earlier is one that stalled) */
        l = (ALLOW_ALL -> dbnow / P : j);
#ifdef MUTANT_TAKE_IGNORES_EXPIRY
        if :: true ->
#else
        if :: lexpires[l] <= dbnow ->
#endif
            ltoken[l]++; lexpires[l] = dbnow + TTL; lreleased[l] = 0;
            lockof[me] = l; token[me] = ltoken[l]; deadline[me] = dbnow + TTL;
            holding[me] = 1; lease[me] = dbnow + TTL;
            cur = dbnow / P;
            /* (b) every take gets a token of its own: no other server has this one */
            PROP(FORALL_S(OWN_TOKEN, me), "MSC: VIOLATED (b): two holders with one token\n");
            printf("MSC: t=%d S%d take job%d: won, token %d, lease to t=%d, slot %d\n",
                   dbnow, me, j, token[me], dbnow + TTL, cur);
            INVARIANTS
        :: else ->
            printf("MSC: t=%d S%d take job%d: held (token %d, lease to t=%d): skip\n",
                   dbnow, me, j, ltoken[l], lexpires[l]);
            j = 0; l = 0
        fi
    };
    if :: holding[me] -> break :: else fi
}

/* sql.py "release": UPDATE joblock SET released_at = now,
   expires_at = GREATEST(now, acquired_at + min_hold)      (min_hold = 0 here)
   WHERE name = j AND token = mine AND released_at IS NULL
   A release that finds the lock no longer ours changes nothing (lock.release, and
   _release_after_loss once the lock was found lost: the statement is the same).
   Then the Lock is done with: what this server believed about it is forgotten.
   (Inside a d_step.) */
inline RELEASE() {
#ifdef MUTANT_RELEASE_NOT_HOLDER_CHECKED
    if :: true ->
#else
    if :: ltoken[l] == token[me] && !lreleased[l] ->
#endif
        lreleased[l] = 1; lexpires[l] = 0 /* = now: PAST */;
        printf("MSC: t=%d S%d release job%d token %d: freed\n", dbnow, me, j, token[me])
    :: else ->
        printf("MSC: t=%d S%d release job%d token %d: not ours any more: nothing changed\n",
               dbnow, me, j, token[me])
    fi;
    holding[me] = 0; lease[me] = 0; lost[me] = 0; deadline[me] = 0; token[me] = 0;
    lockof[me] = 0; pausedsince[me] = 0; revoked[me] = 0;
    INVARIANTS
}

/* runner.py Run._finish: result.duration = now - _started (the job has ended: it returned,
   or LockLost before it started), which record_end writes; history._ran reads the run's
   end as started_at + duration, not finished_at (when the end was written, after the
   release). _started is set just after the claim's insert: the model counts the
   duration from the insert's tick (began), and the end is this tick. The slots after
   the one it ran that began in (started_at, started_at + duration] came during it
   (catchup.plan); under overlap="skip" only if the run lasted its interval or more
   (catchup._overran: else they came during it because it began late, and are
   catch_up's). (Inside a d_step.) */
inline RAN() {
    if
    :: ALLOW_ALL -> skip  /* catchup.plan: ran = None, no slot comes "during" a run */
    :: !ALLOW_ALL && (BUFFER || dbnow - began >= P) ->
        k = serve + 1;
        do
        :: k < NK && k*P <= dbnow ->
            /* buffer_all: since the slot itself, not since the run began (a run that
               began late was buffered, and the slots before it began with it) */
            if :: k*P > began || BUFFER == 2 -> during = during | (1 << k) :: else fi; k++
        :: else -> break
        od
    :: else
    fi;
    k = 0; began = 0
}

/* history.py record_missed -> _record_slots: bulk_create(rows, ignore_conflicts=True):
   INSERT INTO jobrun ... status missed ... ON CONFLICT DO NOTHING (only when any).
   (Inside a d_step.) */
inline RECORD_MISSED() {
    if
    :: missed != 0 ->
        k = 0;
        do
        :: k < NK -> if :: (missed & (1 << k)) && ROW(j, k) == NONE -> ROW(j, k) = MISSED
                        :: else fi; k++
        :: else -> break
        od;
        printf("MSC: t=%d S%d record_missed job%d slots %d (bit mask)\n", dbnow, me, j, missed);
        k = 0; missed = 0
    :: else
    fi
}

/* history.py _record_skipped -> _record_slots: the same INSERT, status skipped.
   (Inside a d_step.) */
inline RECORD_SKIPPED() {
    if
    :: skipped != 0 ->
        k = 0;
        do
        :: k < NK -> if :: (skipped & (1 << k)) && ROW(j, k) == NONE -> ROW(j, k) = SKIPPED
                        :: else fi; k++
        :: else -> break
        od;
        printf("MSC: t=%d S%d record_skipped job%d slots %d (bit mask)\n", dbnow, me, j, skipped);
        k = 0; skipped = 0
    :: else
    fi
}

/* history.py _in_turn (overlap="allow_all"): a job's first claim, inside the transaction
   of _under_lease, after the renewal: SELECT ... FROM joblock WHERE name = job FOR UPDATE
   (the job's own lock row, which every first claim of its slots locks: they go in turn),
   then SELECT ... FROM jobrun WHERE name = j ORDER BY slot DESC LIMIT 1. A row after
   cur (or at it): the job's history began after this slot: nothing is written, the
   start skips. A row before cur: the claim is a later one after all, and plans as one
   (catch_up="latest": the slots between are missed). Its writes follow in the same
   transaction, so the look and the writes are one step: first claims are in turn, and
   no other claim writes a row while no row is committed (a later claim needs a row to
   find). (Inside a d_step.) */
inline LOOK_IN_TURN() {
    latest = NOBODY; k = NK;
    do
    :: k > 0 && latest == NOBODY -> k--; if :: ROW(j, k) != NONE -> latest = k :: else fi
    :: else -> break
    od;
    if
    :: latest == NOBODY -> skip
    :: latest != NOBODY && latest >= cur ->
        later = 1;
        printf("MSC: t=%d S%d claim job%d slot %d in turn: a row at slot %d: the history began after it: skip\n",
               dbnow, me, j, cur, latest)
    :: else ->
        k = latest + 1;
        do :: k < cur -> missed = missed | (1 << k); k++ :: else -> break od;
        owe = missed;
        printf("MSC: t=%d S%d claim job%d slot %d in turn: newest row: slot %d; to record missed %d (bit mask)\n",
               dbnow, me, j, cur, latest, missed)
    fi;
    latest = 0; k = 0
}

/* Symmetry: servers are alike, and so are jobs; every run of the model is a run in
   which server 0 fires first, then server 1, then server 2, and job 0 is taken before
   job 1 is ever tried, once servers and jobs are renamed in that order. Only those
   runs are explored (the properties do not depend on the names). */
#define FIRST_IN_TURN (left < STARTS || fired == me)

/* ---- one server: its triggers, and Run.start / call / finish (runner.py) ------------ */
proctype Server(byte me) {
    byte left = STARTS;      /* triggers this server may still fire */
    byte j;                  /* the job this start is for */
    byte l;                  /* the lock it takes: its job's (ALLOW_ALL: its slot's) */
    byte cur;                /* the current slot: slot_at(lock.acquired_at) */
    byte serve;              /* the slot it runs: plan.run (cur, or one buffered) */
    byte latest;             /* history.py claim: the newest slot <= cur with a row */
    byte missed, skipped;    /* catchup.plan: bit k = slot k */
    byte owe;                /* (d): the slots this claim passes, owed a row once it is through */
    bit runs;                /* catchup.plan: plan.run is a slot (serve) */
    bit first;               /* no row at or before cur: the job's first claim */
    byte began;              /* the run row's started_at */
    byte during;             /* the slots that began during the run (history._ran), bit k */
    bit wrote;
    bit later;               /* _in_turn: a later slot's first claim came first */
    byte k;
{
endidle:
    do
    /* a trigger fires job j now (a local decision), and Run.start sends the take */
    :: atomic { ACTIVE(me) && dbnow < NK*P && left > 0 && FIRST_IN_TURN -> j = 0; TAKE() }
#if NJ > 1
    :: atomic { ACTIVE(me) && dbnow < NK*P && left > 0 && FIRST_IN_TURN && ltoken[0] > 0 ->
        j = 1; TAKE() }
#endif
    od;

    /* runner.py Run._claim: `if not lock.held` (local: lost, or the local deadline has
       passed) -> skipped, nothing claimed */
    atomic { ACTIVE(me) ->
        if :: lost[me] || dbnow >= deadline[me] ->
              printf("MSC: t=%d S%d _claim: lock.held is false: skip\n", dbnow, me);
              goto release
           :: else fi }

    /* history.py claim: SELECT ... FROM jobrun WHERE name = j AND slot <= cur
       ORDER BY slot DESC, attempt DESC LIMIT 1; then catchup.plan (catch_up="latest",
       the overlap BUFFER says) decides locally what is missed, skipped and run */
    atomic { ACTIVE(me) ->
        d_step {
            latest = NOBODY; k = cur + 1; serve = cur;
            do
            :: k > 0 && latest == NOBODY -> k--; if :: ROW(j, k) != NONE -> latest = k :: else fi
            :: else -> break
            od;
            if
            :: latest == cur ->
                /* _again: the slot has a row: Claim(that run): not ours -> skipped */
                printf("MSC: t=%d S%d claim job%d slot %d: has a row already (status %d): skip\n",
                       dbnow, me, j, cur, ROW(j, cur));
                PASS();
                INVARIANTS
            :: latest == NOBODY ->
                runs = 1; first = 1;  /* the job's first run: nothing before it to account for */
                printf("MSC: t=%d S%d claim job%d slot %d: no row at or before it: first run\n",
                       dbnow, me, j, cur)
            :: else ->
                k = latest + 1;
                do
                :: k <= cur ->
                    if
                    :: rduring[j*NK + latest] & (1 << k) ->
                        skipped = skipped | (1 << k)   /* came during the run: overlap's */
                    :: else ->
                        if :: k == cur -> runs = 1
                           :: else -> missed = missed | (1 << k) fi
                    fi;
                    k++
                :: else -> break
                od;
#if BUFFER == 1
                /* buffer_one, cancel_other: of the slots that came during the run, the
                   newest runs now (plan.run: the oldest runnable), before cur (plan.more);
                   the others are skipped */
                if
                :: skipped != 0 ->
                    k = cur;
                    do :: !(skipped & (1 << k)) -> k-- :: else -> break od;
                    skipped = skipped & ~(1 << k); serve = k; runs = 1
                :: else
                fi;
#elif BUFFER == 2
                /* buffer_all (catch_up_limit at least NK): every slot that came during the
                   run is buffered: the oldest runs now; the others, and cur, are left to
                   the starts after it (plan.more), with no row: each of those looks after
                   the newest row and finds the next (RAN: since the slot). A slot recorded
                   missed is newer than every buffered one (it began after the run ended),
                   and its row would hide them from those starts: when there is one, the
                   buffered slots not run now are skipped (catchup.plan;
                   MUTANT_BUFFER_ALL_RECORDS_AHEAD: left for later, as before the fix). */
                if
                :: skipped != 0 ->
                    k = 0;
                    do :: !(skipped & (1 << k)) -> k++ :: else -> break od;
                    serve = k; skipped = skipped & ~(1 << k); runs = 1;
#ifdef MUTANT_BUFFER_ALL_RECORDS_AHEAD
                    if :: true ->
#else
                    if :: missed == 0 ->
#endif
                        printf("MSC: t=%d S%d buffer_all: slot %d now; slots %d (bit mask) left for later starts, with no row\n",
                               dbnow, me, serve, skipped);
#ifdef REACH_LEFT
                        left_for_later = left_for_later | skipped;
#endif
                        skipped = 0
                    :: else
                    fi
                :: else
                fi;
#endif
                /* the buffered slot (serve < cur) too: its row is the run's own */
                owe = (missed | skipped | (1 << serve)) & ((1 << cur) - 1);
                printf("MSC: t=%d S%d claim job%d slot %d: newest row: slot %d; to record missed %d, skipped %d (bit masks); run %d (slot %d)\n",
                       dbnow, me, j, cur, latest, missed, skipped, runs, serve)
            fi;
            latest = 0; k = 0
        };
        /* the slot has a row already (nothing else to do) */
        if :: !runs && missed == 0 && skipped == 0 -> goto release :: else fi }

    /* history.py claim -> _together: a claim's rows (missed, skipped, its run) are
       written in one transaction when there are several statements of them: here the
       record_missed and _record_skipped below, and the insert further down, are one
       step. MUTANT_CLAIM_WRITES_APART: each its own statement, as before the fix (a
       missed slot can be newer than a skipped or buffered one). */
#ifdef MUTANT_CLAIM_WRITES_APART
    if
    :: missed != 0 -> d_step { ACTIVE(me) -> RECORD_MISSED();
                               if :: !runs && skipped == 0 -> PASS() :: else fi; INVARIANTS }
    :: else
    fi;
    if
    :: skipped != 0 -> d_step { ACTIVE(me) -> RECORD_SKIPPED();
                                if :: !runs -> PASS() :: else fi; INVARIANTS }
    :: else
    fi;
#endif
    if
    :: !runs ->   /* Claim(None): nothing runs now -> skipped; the rows in one step */
        if
        :: missed != 0 || skipped != 0 ->
            d_step { ACTIVE(me) -> RECORD_MISSED(); RECORD_SKIPPED(); PASS(); INVARIANTS }
        :: else
        fi;
        goto release
    :: else
    fi;

    /* history.py _insert: runs.create(name=j, slot=serve, attempt=1, token=mine,
       started_at=now): INSERT INTO jobrun ...; the unique (name, slot, attempt) refuses
       a second row, and the IntegrityError returns the row found: not ours (is_ours)
       -> skipped.
       The job's first claim (no row at or before cur) writes under its lease:
       history._under_lease: one transaction.atomic() that first sends lock.renew()
       (sql.py "renew": UPDATE joblock SET expires_at = now + ttl WHERE name = j AND
       token = mine AND released_at IS NULL AND expires_at > now), then the claim's
       writes (here the insert: a first claim records nothing missed or skipped), then
       commits. The renewal locks the lock's row until the commit, so no take comes
       between them: one step here. lock.renew raises LockLost, sending nothing, once the
       lock was found lost (lost_reason); no row back -> LockLost; either way the
       transaction rolls back, nothing is written, and Run.start releases the lock. */
    atomic { ACTIVE(me) ->
        d_step {
            runs = 0;
            if
            :: UNDER_LEASE && !RENEWS(me, l) ->
                lost[me] = 1; missed = 0; skipped = 0;  /* rolled back with the rest */
                printf("MSC: t=%d S%d claim job%d: renew token %d in the insert's transaction: no row back: LockLost, nothing written\n",
                       dbnow, me, j, token[me])
            :: else ->
                if
                :: UNDER_LEASE ->
                    lexpires[l] = dbnow + TTL; lease[me] = dbnow + TTL;
                    deadline[me] = dbnow + TTL;
                    printf("MSC: t=%d S%d claim job%d: renew token %d in the insert's transaction: lease to t=%d\n",
                           dbnow, me, j, token[me], dbnow + TTL)
                :: else
                fi;
#if ALLOW_ALL && !defined(MUTANT_SLOTS_OUT_OF_TURN)
                if :: first -> LOOK_IN_TURN() :: else fi;
#endif
                RECORD_MISSED(); RECORD_SKIPPED();  /* _together: one transaction */
                PASS();
                if
                :: later -> later = 0  /* _in_turn: nothing written */
#ifdef MUTANT_CLAIM_NOT_UNIQUE
                :: !later ->
#else
                :: !later && ROW(j, serve) == NONE ->
#endif
                    ROW(j, serve) = RUNNING; began = dbnow; runs = 1;
                    printf("MSC: t=%d S%d insert run job%d slot %d: ours\n", dbnow, me, j, serve)
                :: else ->
                    printf("MSC: t=%d S%d insert run job%d slot %d: unique violation, the row is not ours: skip\n",
                           dbnow, me, j, serve)
                fi
            fi;
            first = 0;
            INVARIANTS
        };
        if :: runs -> runs = 0 :: else -> goto release fi }

    /* runner.py Run._may_start: `if not lock.held: raise LockLost` (local) */
    atomic { ACTIVE(me) ->
        if
        :: lost[me] || dbnow >= deadline[me] ->
            d_step {
                printf("MSC: t=%d S%d _may_start: lock.held is false: LockLost, job not started\n",
                       dbnow, me);
                RAN() };
            goto finish
        :: else ->
            d_step {
                starts[j*NK + serve]++;
                printf("MSC: t=%d S%d STARTS job%d slot %d (token %d)\n", dbnow, me, j, serve, token[me]);
#ifdef REACH_BUFFERED
                /* not a property: a check that the model reaches a buffered run at all */
                PROP(serve == cur, "MSC: REACHED: a slot that came during a run starts after it\n");
#endif
#ifdef REACH_LEFT
                /* not a property: a later start runs a slot a buffer_all claim left */
                PROP(!(left_for_later & (1 << serve)), "MSC: REACHED: a later start runs a slot left for it\n");
#endif
                PROP(starts[j*NK + serve] <= 1, "MSC: VIOLATED (c): a slot started twice\n") }
        fi }

    /* the job's code: at most one write through the fenced resource, then it returns
       (or stops, once told the lock is lost: lock_lost) */
    do
    /* UPDATE resource SET ..., fence = mine WHERE fence <= mine (not under ALLOW_ALL:
       runs of slots that overlap may share a token, slot_locks.py) */
    :: d_step { ACTIVE(me) && !wrote && !ALLOW_ALL ->
        wrote = 1;
        if
        :: token[me] >= fence[j] ->
            /* (b) accepted writes never go down: the resource keeps the max */
            PROP(token[me] >= fence[j], "MSC: VIOLATED (b): an accepted write went down\n");
            fence[j] = token[me];
            printf("MSC: t=%d S%d fenced write job%d token %d: accepted\n", dbnow, me, j, token[me])
        :: else ->
            printf("MSC: t=%d S%d fenced write job%d token %d: refused (the resource saw %d)\n",
                   dbnow, me, j, token[me], fence[j]);
            PROP(token[me] < fence[j], "MSC: VIOLATED (b): a write was refused with a token not older\n")
        fi }
    /* the job returns; runner.py Run._finish: the duration, lock.stop_keepalive(), then
       lock.release() (the job's return is invisible to the others: one step) */
    :: atomic { ACTIVE(me) -> d_step { wrote = 0; RAN(); RELEASE() }; break }
    od;
    goto record;

finish:
    /* runner.py Run._finish after LockLost: lock.stop_keepalive(), lock.release() */
    atomic { ACTIVE(me) -> d_step { RELEASE() } }
record:
    /* history.py record_end: UPDATE jobrun SET status = .., finished_at = now, duration
       WHERE id = ours AND token = mine. What the next claim reads from it (history._ran:
       started_at + duration) was fixed when the job ended (RAN), not now. */
    atomic { ACTIVE(me) ->
        d_step {
            ROW(j, serve) = ENDED; rduring[j*NK + serve] = during;
            printf("MSC: t=%d S%d record_end job%d slot %d\n", dbnow, me, j, serve);
            INVARIANTS;
            j = 0; l = 0; cur = 0; serve = 0; during = 0 };
        goto endidle }

release:
    /* runner.py Run.start: skipped after the take -> lock.release() */
    atomic { ACTIVE(me) -> d_step { RELEASE(); j = 0; l = 0; cur = 0; serve = 0 }; goto endidle }
} unless { crashed[me] }
}

/* ---- keep-alive: the renewing thread and its watchdog (keepalive.py) ------------------ */
proctype KeepAlive(byte me) {
{
end:
    do
    /* KeepAlive.run, every ttl/3: lock.renew() sends sql.py "renew":
       UPDATE joblock SET expires_at = now + ttl
       WHERE name = j AND token = mine AND released_at IS NULL AND expires_at > now
       RETURNING expires_at. A row back: the local deadline moves to now + ttl; none
       back: LockLost (lock.renew -> _lose) */
    :: d_step { ACTIVE(me) && holding[me] && !lost[me] ->
        if
        :: ltoken[lockof[me]] == token[me] && !lreleased[lockof[me]] && lexpires[lockof[me]] > dbnow ->
            lexpires[lockof[me]] = dbnow + TTL; lease[me] = dbnow + TTL;
            deadline[me] = dbnow + TTL;
            printf("MSC: t=%d S%d renew job%d token %d: lease to t=%d\n",
                   dbnow, me, lockof[me], token[me], dbnow + TTL)
        :: else ->
            printf("MSC: t=%d S%d renew job%d token %d: no row back: LockLost\n",
                   dbnow, me, lockof[me], token[me]);
            lost[me] = 1
        fi;
        INVARIANTS }
    /* the renewal gets no answer (the database does not answer): _renew_until_deadline
       marks the lock lost once the local deadline has passed (_lease_slipped), else it
       tries again later */
    :: d_step { ACTIVE(me) && holding[me] && !lost[me] && dbnow >= deadline[me] ->
        lost[me] = 1;
        printf("MSC: t=%d S%d renew job%d: no answer from the database, lease slipped: lock lost\n",
               dbnow, me, lockof[me]);
        INVARIANTS }
#ifndef MUTANT_NO_WATCHDOG
    /* KeepAlive._watch / _give_up: deadline - margin has come and no renewal moved the
       deadline: the lock is marked lost (lock_lost: the job is told to stop) */
    :: d_step { ACTIVE(me) && holding[me] && !lost[me] && dbnow + MARGIN >= deadline[me] ->
        lost[me] = 1;
        printf("MSC: t=%d S%d watchdog job%d token %d: no renewal got through: lock lost\n",
               dbnow, me, lockof[me], token[me]);
        INVARIANTS }
#endif
    od
} unless { crashed[me] }
}

/* ---- faults: a crash (kill -9) or a pause (SIGSTOP, then SIGCONT) of a holder ---------- */
/* one more crash, pause or force-release is within the bounds */
#define MAY_DISTURB (FAULTS - faults + FORCE - forces < DISTURBANCES)
#define CRASH(s) :: d_step { faults > 0 && MAY_DISTURB && holding[s] && !crashed[s] -> \
        faults--; crashed[s] = 1; \
        printf("MSC: t=%d S%d CRASH (kill -9)\n", dbnow, s) }
#define PAUSE(s) :: d_step { faults > 0 && MAY_DISTURB && holding[s] && !paused[s] \
        && !crashed[s] -> \
        faults--; paused[s] = 1; pausedsince[s] = 1; \
        printf("MSC: t=%d S%d PAUSE (SIGSTOP)\n", dbnow, s); INVARIANTS }
#define RESUME(s) :: d_step { paused[s] -> paused[s] = 0; \
        printf("MSC: t=%d S%d RESUME (SIGCONT)\n", dbnow, s); INVARIANTS }

active proctype Nemesis() {
end:
    do
    CRASH(0) PAUSE(0) RESUME(0)
#if NS > 1
    CRASH(1) PAUSE(1) RESUME(1)
#endif
#if NS > 2
    CRASH(2) PAUSE(2) RESUME(2)
#endif
    od
}

/* ---- the operator ---------------------------------------------------------------------- */
/* models.py JobLockQuerySet.force_release: UPDATE joblock SET released_at = now,
   expires_at = now WHERE name = j AND NOT free (free: expires_at IS NULL, or released
   and expires_at <= now). The holder is not told: its next renew finds no row. */
#define REVOKE(s, jj) if :: holding[s] && lockof[s] == (jj) && token[s] == ltoken[jj] \
        && !lreleased[jj] -> revoked[s] = 1; lease[s] = 0 :: else fi
#define FORCE_RELEASE(jj) :: d_step { forces > 0 && MAY_DISTURB && ltoken[jj] > 0 \
        && !(lreleased[jj] && lexpires[jj] <= dbnow) -> \
        forces--; \
        REVOKE(0, jj); REVOKE(1 % NS, jj); REVOKE(2 % NS, jj); \
        lreleased[jj] = 1; lexpires[jj] = 0 /* = now: PAST */; \
        printf("MSC: t=%d OPERATOR force-release job%d (token %d)\n", dbnow, jj, ltoken[jj]); \
        INVARIANTS }

active proctype Operator() {
end:
    do
    FORCE_RELEASE(0)
#if NL > 1
    FORCE_RELEASE(1)
#endif
#if NL > 2
    FORCE_RELEASE(2)
#endif
#if NL > 3
    FORCE_RELEASE(3)
#endif
    od
}

init {
    atomic {
        run Server(0); run KeepAlive(0);
#if NS > 1
        run Server(1); run KeepAlive(1);
#endif
#if NS > 2
        run Server(2); run KeepAlive(2)
#endif
    }
}
