/*
 * Concurrency groups (run/groups.py) as a Promela model for spin: two jobs of one
 * group, NS servers starting them, the group's lock taken after each job's own.
 *
 * Checked by scripts/model.sh (the checks named groups-*) and tests/test_model.py;
 * explained in docs/model.md. The lock statements are those of protocol.pml (sql.py
 * take, renew, release on the database's clock); the slot and its claim are left to
 * that model: here a start that holds its job's lock is one whose claim decided that it
 * runs (a start that runs nothing never takes the group: groups.py).
 *
 * What a server does for a start (runner.py, starting.py, finishing.py): take its job's
 * lock; take the group's (all or none): held by another member's run, it releases its
 * own and the start ends (overlap="skip" records its slot skipped; the other policies
 * wait their turn: a later start, STARTS); else it starts the job in a child process
 * whose guard (process.py) kills it when the first of its leases could end
 * (Run.lease_end: the earlier of its own lock's and its group's deadlines, sent to the
 * guard at each renewal) less the margin; keep-alive renews each lock on its own (a
 * renewal may not come: a database that stops answering, a paused server); when the
 * job ends, the group's lock is released, then its own. A renewal that finds a lock no
 * longer its own marks the run lost, and the scheduler stops the job.
 *
 * A nemesis crashes a server (kill -9: it never acts again; its child's guard still
 * kills the job at its deadline) or pauses one (SIGSTOP: no renewal, no release; the
 * guard, in the child, still acts), and an operator may force-release the group's lock
 * (models.py force_release).
 *
 * Property:
 *  (g) no two jobs run at the same time (two servers each with its job's process
 *      running), unless an operator force-released a lock one of them held: the
 *      group's promise, which the leases keep whatever the servers do.
 *  (e) no invalid end state: spin's own check.
 *
 * Mutant (spin -DMUTANT_...; scripts/model.sh requires a counterexample):
 *  MUTANT_GUARD_OWN_LEASE  the job's guard follows only its own lock's lease (before
 *                          Run.lease_end): a group renewal that does not come lets the
 *                          group's lease end while the job runs: refuted by (g)
 * Not a mutant:
 *  REACH_BUSY              an assertion that no start ever finds the group held by
 *                          the other job's run, which spin must refute (the model does
 *                          reach a busy group)
 */

#ifndef NS
#define NS 2            /* servers (2 or 3) */
#endif
#ifndef STARTS
#define STARTS 2        /* starts per server */
#endif
#ifndef TTL
#define TTL 2           /* ticks of lease */
#endif
#define MARGIN 1        /* watchdog_margin(ttl): the guard kills this long before */
#ifndef MAXT
#define MAXT 6          /* the clock stops here */
#endif
#ifndef FAULTS
#define FAULTS 1        /* crashes and pauses, in all */
#endif
#ifndef FORCE
#define FORCE 0         /* operator force-releases of the group's lock */
#endif
#define NJ 2            /* the group's two jobs */
#define G NJ            /* the group's lock: row NJ; rows 0 and 1 are the jobs' own */

#define PAST(x) if :: (x) <= dbnow -> x = 0 :: else fi
#define MIN(a, b) ((a) < (b) -> (a) : (b))

/* ---- the database ---------------------------------------------------------------- */
byte dbnow;
byte ltoken[NJ + 1];
byte lexpires[NJ + 1];
bit lreleased[NJ + 1];

/* ---- each server: its run, as its process, keep-alive and child's guard see it ---- */
byte job[NS];                  /* the job of its run */
byte tok[NS];                  /* its own lock's token */
byte gtok[NS];                 /* its group lock's token */
byte dl[NS];                   /* its own lock's local deadline */
byte gdl[NS];                  /* its group lock's local deadline */
byte guard[NS];                /* when the child's guard kills the job (plus MARGIN) */
bit own[NS];                   /* holding its job's lock */
bit grp[NS];                   /* holding the group's lock */
bit injob[NS];                 /* the job's process runs */
bit lost[NS];                  /* a renewal found a lock no longer its own */
bit paused[NS];
bit crashed[NS];

/* ---- ghosts ---------------------------------------------------------------------- */
bit revoked[NS];               /* an operator force-released the group it held */
byte gjob;                     /* the job of the group's last taker */
byte faults = FAULTS;
byte forces = FORCE;

#if NS == 2
#define TOGETHER (injob[0] && injob[1] && !revoked[0] && !revoked[1])
#define GUARD_DUE ((injob[0] && dbnow + MARGIN >= guard[0]) || \
                   (injob[1] && dbnow + MARGIN >= guard[1]))
#else
#define TWO(a, b) (injob[a] && injob[b] && !revoked[a] && !revoked[b])
#define TOGETHER (TWO(0, 1) || TWO(0, 2) || TWO(1, 2))
#define GUARD_DUE ((injob[0] && dbnow + MARGIN >= guard[0]) || \
                   (injob[1] && dbnow + MARGIN >= guard[1]) || \
                   (injob[2] && dbnow + MARGIN >= guard[2]))
#endif
#define PROP(cond, text) if :: !(cond) -> printf(text) :: else fi; assert(cond)
#define INVARIANTS PROP(!TOGETHER, "MSC: VIOLATED (g): two jobs of the group run at once\n")

/* The guard's deadline (process.py JobProcess.extend: the first of the leases' ends) */
#ifdef MUTANT_GUARD_OWN_LEASE
#define LEASE_END(me) dl[me]
#else
#define LEASE_END(me) MIN(dl[me], gdl[me])
#endif

/* The clock may not pass the moment a child's guard must kill its job: the guard is a
   timer in the job's own process, which no pause of the scheduler stops. */
active proctype Clock() {
end:
    do
    :: d_step { dbnow < MAXT && !GUARD_DUE ->
        dbnow++;
        printf("MSC: ---- t=%d\n", dbnow);
        PAST(lexpires[0]); PAST(lexpires[1]); PAST(lexpires[2]);
        INVARIANTS }
    od
}

/* An operator force-releases the group's lock (whoever holds it). */
active proctype Operator() {
    byte s;
end:
    do
    :: d_step { forces > 0 && lexpires[G] > dbnow && !lreleased[G] ->
        forces--;
        s = 0;
        do
        :: s < NS -> if :: grp[s] && gtok[s] == ltoken[G] -> revoked[s] = 1 :: else fi; s++
        :: else -> break
        od;
        lreleased[G] = 1; lexpires[G] = 0; s = 0;
        printf("MSC: t=%d operator force-releases the group\n", dbnow) }
    od
}

/* sql.py "renew" of lock l with token t (keep-alive): the new local deadline, or 0 when
   the lock is no longer ours. */
#define RENEWS(l, t) (ltoken[l] == (t) && !lreleased[l] && lexpires[l] > dbnow)

proctype Server(byte me) {
    byte left = STARTS;
    byte j;
end:
    do
    /* A start: sql.py "take" of its job's lock, then of the group's (groups.take). */
    :: atomic { left > 0 && !own[me] && !paused[me] && !crashed[me] ->
        left--;
        if :: j = 0 :: j = 1 fi;  /* either job (atomic, not d_step: both are explored) */
        if
        :: lexpires[j] <= dbnow ->
            ltoken[j]++; lexpires[j] = dbnow + TTL; lreleased[j] = 0;
            job[me] = j; tok[me] = ltoken[j]; dl[me] = dbnow + TTL; own[me] = 1;
            printf("MSC: t=%d S%d take job%d: won, token %d\n", dbnow, me, j, tok[me])
        :: else ->
            printf("MSC: t=%d S%d take job%d: held: skip\n", dbnow, me, j)
        fi }
    :: d_step { own[me] && !grp[me] && guard[me] == 0 && !paused[me] && !crashed[me] ->
        if
        :: lexpires[G] <= dbnow ->
            ltoken[G]++; lexpires[G] = dbnow + TTL; lreleased[G] = 0;
            gtok[me] = ltoken[G]; gdl[me] = dbnow + TTL; grp[me] = 1; gjob = job[me];
            /* the claim's row, then the job's process with its guard (start_child) */
            guard[me] = LEASE_END(me); injob[me] = 1; revoked[me] = 0;
            printf("MSC: t=%d S%d take the group: won, token %d; job%d runs, guard at t=%d\n",
                   dbnow, me, gtok[me], job[me], guard[me] - MARGIN)
        :: else ->
#ifdef REACH_BUSY
            if :: gjob != job[me] ->
                printf("MSC: REACHED: job%d finds the group held by job%d's run\n", job[me], gjob)
            :: else fi;
            assert(gjob == job[me]);
#endif
            /* busy: skip (recorded) or wait its turn (a later start); its own lock freed */
            if :: ltoken[job[me]] == tok[me] && !lreleased[job[me]] ->
                lreleased[job[me]] = 1; lexpires[job[me]] = 0 :: else fi;
            own[me] = 0; dl[me] = 0; tok[me] = 0;
            printf("MSC: t=%d S%d take the group: held by another member's run: job%d does not run now\n",
                   dbnow, me, job[me])
        fi;
        INVARIANTS }
    /* Keep-alive: each lock renewed on its own (or not: a renewal may never come). */
    :: d_step { own[me] && injob[me] && !lost[me] && !paused[me] && !crashed[me] ->
        if
        :: RENEWS(job[me], tok[me]) ->
            lexpires[job[me]] = dbnow + TTL; dl[me] = dbnow + TTL;
            if :: guard[me] < LEASE_END(me) -> guard[me] = LEASE_END(me) :: else fi;
            printf("MSC: t=%d S%d renew job%d: to t=%d\n", dbnow, me, job[me], dl[me])
        :: else -> lost[me] = 1; printf("MSC: t=%d S%d renew job%d: lost\n", dbnow, me, job[me])
        fi }
    :: d_step { grp[me] && injob[me] && !lost[me] && !paused[me] && !crashed[me] ->
        if
        :: RENEWS(G, gtok[me]) ->
            lexpires[G] = dbnow + TTL; gdl[me] = dbnow + TTL;
            if :: guard[me] < LEASE_END(me) -> guard[me] = LEASE_END(me) :: else fi;
            printf("MSC: t=%d S%d renew the group: to t=%d\n", dbnow, me, gdl[me])
        :: else -> lost[me] = 1; printf("MSC: t=%d S%d renew the group: lost\n", dbnow, me)
        fi }
    /* The job ends by itself, or is stopped: the child's guard (at any time, paused or
       crashed server or not), or the scheduler once a lock was found lost. */
    :: d_step { injob[me] -> injob[me] = 0; printf("MSC: t=%d S%d job%d ends\n", dbnow, me, job[me]) }
    :: d_step { injob[me] && dbnow + MARGIN >= guard[me] ->
        injob[me] = 0; printf("MSC: t=%d S%d guard kills job%d\n", dbnow, me, job[me]) }
    /* Its end (finishing.py): the group's lock released first, then its own. */
    :: d_step { grp[me] && !injob[me] && !paused[me] && !crashed[me] ->
        if :: ltoken[G] == gtok[me] && !lreleased[G] -> lreleased[G] = 1; lexpires[G] = 0
        :: else fi;
        grp[me] = 0; gdl[me] = 0; gtok[me] = 0; revoked[me] = 0;
        printf("MSC: t=%d S%d release the group\n", dbnow, me) }
    :: d_step { own[me] && !grp[me] && !injob[me] && guard[me] != 0 && !paused[me] && !crashed[me] ->
        if :: ltoken[job[me]] == tok[me] && !lreleased[job[me]] ->
            lreleased[job[me]] = 1; lexpires[job[me]] = 0 :: else fi;
        own[me] = 0; dl[me] = 0; tok[me] = 0; lost[me] = 0; guard[me] = 0;
        printf("MSC: t=%d S%d release job%d\n", dbnow, me, job[me]) }
    /* The nemesis: kill -9 or SIGSTOP of a server that holds a lock; a pause ends. */
    :: d_step { faults > 0 && own[me] && !crashed[me] && !paused[me] ->
        faults--;
        if :: crashed[me] = 1; printf("MSC: t=%d S%d kill -9\n", dbnow, me)
           :: paused[me] = 1; printf("MSC: t=%d S%d SIGSTOP\n", dbnow, me)
        fi }
    :: d_step { paused[me] -> paused[me] = 0; printf("MSC: t=%d S%d SIGCONT\n", dbnow, me) }
    od
}

init {
    byte s = 0;
    atomic {
        do
        :: s < NS -> run Server(s); s++
        :: else -> break
        od
    }
}
