// stop_signal.h: a polite stop before the time limit, agreed by every rank.
//
// A scheduler warns a job before it kills it: Slurm sends SIGTERM at the time
// limit (or at scancel) and SIGKILL KillWait seconds later (30 by default), and
// `sbatch --signal=B:USR1@120` has the batch shell get SIGUSR1 two minutes
// before. Once stop_signal_install() has run, SIGUSR1 and SIGTERM no longer kill
// the process: they set a flag. The training loop asks at the end of every step
//
//   if (stop_signal_agreed()) { save a snapshot; exit(EXIT_STOPPED); }
//
// stop_signal_agreed() is a collective (an allreduce of each rank's flag), so
// that all ranks see the same answer at the same step even though the signal
// reaches them at different moments, or reaches only some of them.
#pragma once

// sysexits.h's EX_TEMPFAIL, "temporary failure, try again later": the run saved
// a snapshot and stopped on request; started again, it resumes from there.
#define EXIT_STOPPED 75

// SIGUSR1 and SIGTERM set the flag from now on (sigaction, SA_RESTART).
void stop_signal_install(void);
// The signal this rank received (SIGUSR1 or SIGTERM), or 0: local, no communication.
int stop_signal_received(void);
// Collective: the signal that some rank received (the highest number when they
// differ), or 0 if none did. Every rank gets the same answer.
int stop_signal_agreed(void);
