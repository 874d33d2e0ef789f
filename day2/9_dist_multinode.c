// Step 9: one allreduce across nodes, ranks from Slurm.    PyTorch twin: 9_torch_dist_multi_node.py
//
// What it adds over step 0: the ranks now live on several machines, and Slurm,
// not mpirun, decides where. Slurm tells every task its place in environment
// variables: SLURM_PROCID (global rank), SLURM_LOCALID (rank on its node),
// SLURM_NODEID (which node of the job) and SLURM_NTASKS (world size). The
// PyTorch script reads them to set up torch.distributed; MPI learns the same
// facts from srun through PMIx. This program reads both and checks that they
// agree, so a launch that went wrong (srun without --mpi=pmix: every task an
// MPI world of one) is one clear error, not a silent single-process run.
// Then the allreduce of step 0: rank r holds r + 1, all agree on sum and mean.
//
// Which view it checks:
//   srun (--mpi=pmix)          SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS
//   mpirun inside an allocation  OMPI_COMM_WORLD_RANK, _LOCAL_RANK, _SIZE (there the
//                              SLURM_* variables describe mpirun's one daemon per node)
//   no Slurm                   MPI's own view (rank 0 says so)
// Node ids not given by Slurm come from MPI: the nodes are its shared-memory
// groups, numbered in the order of their lowest rank.
//
// Build and run (README.md, Day 2):
//   make day2/9_dist_multinode
//   salloc --nodes 2 --ntasks-per-node=4 --time 00:10:00
//   ./slurm/multinode_setup_and_run.sh day2/9_dist_multinode     # srun -l --mpi=pmix ...
//   srun -l --mpi=pmix day2/9_dist_multinode                      # the same, by hand
// or on one machine:  mpirun -np 4 day2/9_dist_multinode
//
// Expected output on 2 nodes x 2 tasks (srun -l adds "r: "; the order varies):
//   0: Step 9: 4 ranks; placement from Slurm (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS) agrees with MPI
//   0: [rank 0] running on rank 0 (local 0, node 0) with world size 4, host node1
//   1: [rank 1] running on rank 1 (local 1, node 0) with world size 4, host node1
//   2: [rank 2] running on rank 2 (local 0, node 1) with world size 4, host node2
//   3: [rank 3] running on rank 3 (local 1, node 1) with world size 4, host node2
//   2: [rank 2] after allreduce: sum 10, mean 2.5
//   ...
//   0: Program complete
#include <stdio.h>
#include <stdlib.h>

#include "args.h"
#include "check.h"
#include "dist.h"

// The launcher's environment, copied before MPI_Init: MPI may add variables
// of its own, and we want to see what the launcher said.
typedef struct {
    char text[32];
    int set;
} EnvVar;

static EnvVar env_snapshot(const char *name) {
    EnvVar var = {{0}, 0};
    const char *value = getenv(name);
    if (value) snprintf(var.text, sizeof var.text, "%s", value), var.set = 1;
    return var;
}

// A launcher's number. A value that is not a whole number >= 0 is a broken
// environment: say which variable, rather than guess.
static int env_int(const EnvVar *var, const char *name, char *problem, size_t size) {
    char *end = NULL;
    long value = strtol(var->text, &end, 10);
    if (var->text[0] == '\0' || *end != '\0' || value < 0 || value > 1 << 30) {
        if (!problem[0]) snprintf(problem, size, "%s='%s' is not a whole number >= 0", name, var->text);
        return -1;
    }
    return (int)value;
}

// Compare one number of the launcher's with MPI's; remember the first mismatch.
static void expect_same(const char *launcher_name, int launcher_value, const char *mpi_name, int mpi_value,
                        char *problem, size_t size) {
    if (launcher_value < 0 || launcher_value == mpi_value || problem[0]) return;
    snprintf(problem, size, "the launcher and MPI disagree: %s=%d but MPI's %s is %d", launcher_name, launcher_value,
             mpi_name, mpi_value);
}

int main(int argc, char **argv) {
    EnvVar slurm_job = env_snapshot("SLURM_JOB_ID");
    EnvVar slurm_procid = env_snapshot("SLURM_PROCID"), slurm_localid = env_snapshot("SLURM_LOCALID");
    EnvVar slurm_nodeid = env_snapshot("SLURM_NODEID"), slurm_ntasks = env_snapshot("SLURM_NTASKS");
    // mpirun (Open MPI's ORTE) gives each process it starts these three.
    EnvVar ompi_rank = env_snapshot("OMPI_COMM_WORLD_RANK"), ompi_local = env_snapshot("OMPI_COMM_WORLD_LOCAL_RANK");
    EnvVar ompi_size = env_snapshot("OMPI_COMM_WORLD_SIZE");

    dist_init(&argc, &argv);
    args_parse(argc, argv, NULL, 0, "Step 9: allreduce across nodes; checks Slurm's placement against MPI's.");
    int rank = dist_rank(), world = dist_world_size(), local_rank = dist_local_rank();

    // MPI's node id: the ranks that share memory form a node; its leader
    // (local rank 0) numbers the nodes in the order of the leaders' ranks.
    MPI_Comm node_comm, leaders;
    CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_comm));
    CHECK_MPI(MPI_Comm_split(MPI_COMM_WORLD, local_rank == 0 ? 0 : MPI_UNDEFINED, rank, &leaders));
    int mpi_node = 0;
    if (leaders != MPI_COMM_NULL) {
        CHECK_MPI(MPI_Comm_rank(leaders, &mpi_node));
        CHECK_MPI(MPI_Comm_free(&leaders));
    }
    CHECK_MPI(MPI_Bcast(&mpi_node, 1, MPI_INT, 0, node_comm));

    char problem[512] = "";
    int node = mpi_node;
    const char *source;
    char source_text[256];
    if (ompi_rank.set) {
        // Started by mpirun. Inside an allocation mpirun starts one daemon per
        // node with srun, and the ranks inherit the daemon's SLURM_PROCID and
        // SLURM_NTASKS: those number the nodes, not the ranks. Check mpirun's own.
        expect_same("OMPI_COMM_WORLD_RANK", env_int(&ompi_rank, "OMPI_COMM_WORLD_RANK", problem, sizeof problem),
                    "rank", rank, problem, sizeof problem);
        if (ompi_size.set)
            expect_same("OMPI_COMM_WORLD_SIZE", env_int(&ompi_size, "OMPI_COMM_WORLD_SIZE", problem, sizeof problem),
                        "world size", world, problem, sizeof problem);
        if (ompi_local.set)
            expect_same("OMPI_COMM_WORLD_LOCAL_RANK",
                        env_int(&ompi_local, "OMPI_COMM_WORLD_LOCAL_RANK", problem, sizeof problem),
                        "local rank", local_rank, problem, sizeof problem);
        if (slurm_job.set) {
            snprintf(source_text, sizeof source_text,
                     "launched by mpirun inside Slurm job %s: SLURM_PROCID there numbers mpirun's daemons (one per "
                     "node), so ranks are checked against OMPI_COMM_WORLD_*, node ids come from MPI",
                     slurm_job.text);
        } else {
            snprintf(source_text, sizeof source_text,
                     "not under Slurm: ranks checked against mpirun's OMPI_COMM_WORLD_*, node ids from MPI");
        }
        source = source_text;
    } else if (slurm_procid.set) {
        // Started by srun: Slurm's numbers must be MPI's numbers.
        int procid = env_int(&slurm_procid, "SLURM_PROCID", problem, sizeof problem);
        int ntasks = slurm_ntasks.set ? env_int(&slurm_ntasks, "SLURM_NTASKS", problem, sizeof problem) : -1;
        int localid = slurm_localid.set ? env_int(&slurm_localid, "SLURM_LOCALID", problem, sizeof problem) : -1;
        int nodeid = slurm_nodeid.set ? env_int(&slurm_nodeid, "SLURM_NODEID", problem, sizeof problem) : -1;
        if (!problem[0] && world == 1 && ntasks > 1)
            // The classic mistake: srun without PMIx. Each task starts MPI on its own.
            snprintf(problem, sizeof problem,
                     "Slurm started %d tasks but MPI sees a world of 1: each task initialised MPI on its own. "
                     "Launch with srun --mpi=pmix (see srun --mpi=list) or mpirun",
                     ntasks);
        expect_same("SLURM_PROCID", procid, "rank", rank, problem, sizeof problem);
        expect_same("SLURM_NTASKS", ntasks, "world size", world, problem, sizeof problem);
        expect_same("SLURM_LOCALID", localid, "local rank", local_rank, problem, sizeof problem);
        // MPI's nodes must be Slurm's nodes: every rank in my shared-memory
        // group has my SLURM_NODEID. (Their numbering may differ, so compare
        // within the group, not with mpi_node.)
        int lowest = nodeid, highest = nodeid;
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, node_comm));
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &highest, 1, MPI_INT, MPI_MAX, node_comm));
        if (!problem[0] && lowest != highest)
            snprintf(problem, sizeof problem,
                     "the launcher and MPI disagree: MPI puts ranks with SLURM_NODEID %d and %d on one node", lowest,
                     highest);
        if (nodeid >= 0) node = nodeid;
        source = "placement from Slurm (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS) agrees with MPI";
    } else if (slurm_job.set) {
        snprintf(source_text, sizeof source_text,
                 "inside Slurm job %s but not started by srun (no SLURM_PROCID): placement from MPI", slurm_job.text);
        source = source_text;
    } else {
        source = "not under Slurm (no SLURM_PROCID): placement from MPI, node ids from its shared-memory groups";
    }
    // Every rank reaches this point with its own verdict; the lowest failing
    // rank prints it and all stop together.
    check_all_ranks(problem[0] == '\0', problem);
    CHECK_MPI(MPI_Comm_free(&node_comm));

    print0("Step 9: %d rank%s; %s\n", world, world == 1 ? "" : "s", source);
    print_rank("running on rank %d (local %d, node %d) with world size %d, host %s\n", rank, local_rank, node, world,
               dist_hostname());

    // Step 0's allreduce, now across nodes: rank r holds r + 1.
    float value = (float)(rank + 1);
    dist_allreduce_sum(&value, 1);
    float sum = value, mean = sum / (float)world;
    print_rank("after allreduce: sum %g, mean %g\n", sum, mean);

    dist_barrier();  // every rank is done before rank 0 says so
    print0("Program complete\n");
    dist_finalize();
    return 0;
}
