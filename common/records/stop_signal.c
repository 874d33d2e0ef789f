// stop_signal.c: SIGUSR1/SIGTERM become a flag that the ranks agree on. See stop_signal.h.
#include "records/stop_signal.h"

#include <signal.h>
#include <string.h>

#include "base/check.h"

// Written by the handler, read by the training loop: sig_atomic_t is what a
// handler may write.
static volatile sig_atomic_t g_received;

static void on_stop_signal(int signal_number) { g_received = signal_number; }

void stop_signal_install(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // a read or write in progress goes on, not fails with EINTR
    CHECK_ERRNO(sigaction(SIGUSR1, &action, NULL) == 0, "sigaction(%s)", "SIGUSR1");
    CHECK_ERRNO(sigaction(SIGTERM, &action, NULL) == 0, "sigaction(%s)", "SIGTERM");
}

int stop_signal_received(void) { return g_received; }

int stop_signal_agreed(void) {
    int signal_number = g_received;
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &signal_number, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    return signal_number;
}
