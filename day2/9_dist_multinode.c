// Step 9: one allreduce across nodes, ranks from Slurm.    PyTorch twin: 9_torch_dist_multi_node.py
//
// What it adds over step 0: the ranks now live on several machines, and Slurm,
// not mpirun, decides where. Slurm tells every task its place in environment
// variables: SLURM_PROCID (global rank), SLURM_LOCALID (rank on its node),
// SLURM_NODEID (which node of the job) and SLURM_NTASKS (world size). The
// PyTorch script reads them to set up torch.distributed; MPI learns the same
// facts from srun through PMIx. This program reads both and checks that they
// agree, so that a launch gone wrong (tasks that each started an MPI world of
// their own, ranks that are not Slurm's) stops with one clear error instead of
// training quietly on the wrong layout. Then step 0's allreduce: rank r holds
// r + 1, and all ranks, on all nodes, agree on the sum and the mean.
//
// Which view it checks MPI's against:
//   started by srun --mpi=pmix     SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS
//   started by mpirun              OMPI_COMM_WORLD_RANK, _LOCAL_RANK, _SIZE (inside an
//                                  allocation the SLURM_* variables then describe mpirun's
//                                  daemons, one per node, not the ranks)
//   neither                        none: MPI's own view (rank 0 says so)
// Node ids that Slurm does not give come from MPI: the nodes are its
// shared-memory groups, numbered in the order of their lowest rank.
//
// Build and run (day2/README.md):
//   make day2/9_dist_multinode
//   salloc --nodes 2 --ntasks-per-node=4 --time 00:10:00
//   ./slurm/multinode_setup_and_run.sh day2/9_dist_multinode    # srun -l --mpi=pmix ... for you
//   srun -l --mpi=pmix day2/9_dist_multinode                     # the same, by hand
//   PROGRAM=day2/9_dist_multinode sbatch slurm/day2.sbatch       # as a batch job
// or on one machine:  mpirun -np 4 day2/9_dist_multinode
//
// Expected output on 2 nodes x 2 tasks (srun -l puts "task: " first; the order varies):
//   0: Step 9: 4 ranks; placement from Slurm (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS) agrees with MPI
//   0: [rank 0] running on rank 0 (local 0, node 0) with world size 4, host node1
//   1: [rank 1] running on rank 1 (local 1, node 0) with world size 4, host node1
//   2: [rank 2] running on rank 2 (local 0, node 1) with world size 4, host node2
//   3: [rank 3] running on rank 3 (local 1, node 1) with world size 4, host node2
//   2: [rank 2] after allreduce: sum 10, mean 2.5
//   ...                                                          (one per rank)
//   0: Program complete
#include <stdio.h>
#include <stdlib.h>

#include "base/args.h"     // args_parse: the flags and --help
#include "base/check.h"    // CHECK, xmalloc: fail fast, on every rank
#include "runtime/dist.h"  // dist_init, dist_rank, print0: the process group

// What the launcher put in the environment, copied before MPI_Init: MPI may
// add variables of its own, and we want what the launcher said.
typedef struct {
    const char *name;
    char value[32];
    int set;
} EnvVar;

static EnvVar env_snapshot(const char *name) {
    EnvVar var = {name, "", 0};
    const char *value = getenv(name);
    if (value) snprintf(var.value, sizeof var.value, "%s", value), var.set = 1;
    return var;
}

// The first disagreement found on this rank ("" while there is none).
#define PROBLEM_SIZE 512

// The variable as a number, or -1 when it is not set. A value that is not a
// whole number >= 0 is a broken environment: say which, rather than guess.
static int env_int(const EnvVar *var, char *problem) {
    if (!var->set) return -1;
    char *end = NULL;
    long value = strtol(var->value, &end, 10);
    if (var->value[0] == '\0' || *end != '\0' || value < 0 || value > 1 << 30) {
        if (!problem[0]) snprintf(problem, PROBLEM_SIZE, "%s='%s' is not a whole number >= 0", var->name, var->value);
        return -1;
    }
    return (int)value;
}

// The launcher's number must be MPI's.
static void expect_same(const EnvVar *var, const char *mpi_name, int mpi_value, char *problem) {
    int value = env_int(var, problem);
    if (value < 0 || value == mpi_value || problem[0]) return;
    snprintf(problem, PROBLEM_SIZE, "the launcher and MPI disagree: %s=%d but MPI's %s is %d", var->name, value,
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

    // MPI's node id: the ranks that share memory form a node, and the nodes
    // are numbered in the order of their leaders' (local rank 0) ranks.
    MPI_Comm node_comm, leaders;
    CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_comm));
    CHECK_MPI(MPI_Comm_split(MPI_COMM_WORLD, local_rank == 0 ? 0 : MPI_UNDEFINED, rank, &leaders));
    int node = 0;
    if (leaders != MPI_COMM_NULL) {
        CHECK_MPI(MPI_Comm_rank(leaders, &node));
        CHECK_MPI(MPI_Comm_free(&leaders));
    }
    CHECK_MPI(MPI_Bcast(&node, 1, MPI_INT, 0, node_comm));

    char problem[PROBLEM_SIZE] = "";
    char source[256];  // where the placement came from, for rank 0's line
    if (ompi_rank.set) {
        // Started by mpirun. Inside an allocation mpirun starts one daemon per
        // node with srun, and the ranks inherit the daemon's SLURM_PROCID and
        // SLURM_NTASKS: those count nodes, not ranks. Check mpirun's own.
        expect_same(&ompi_rank, "rank", rank, problem);
        expect_same(&ompi_size, "world size", world, problem);
        expect_same(&ompi_local, "local rank", local_rank, problem);
        if (slurm_job.set)
            snprintf(source, sizeof source,
                     "launched by mpirun inside Slurm job %s: SLURM_PROCID there counts mpirun's daemons (one per "
                     "node), so ranks are checked against OMPI_COMM_WORLD_*, node ids come from MPI",
                     slurm_job.value);
        else
            snprintf(source, sizeof source,
                     "not under Slurm: ranks checked against mpirun's OMPI_COMM_WORLD_*, node ids from MPI");
    } else if (slurm_procid.set) {
        // Started by srun: Slurm's numbers must be MPI's numbers.
        int ntasks = env_int(&slurm_ntasks, problem);
        if (!problem[0] && world == 1 && ntasks > 1)
            // The classic mistake: srun without PMIx, each task an MPI world
            // of its own. (Open MPI itself stops that case in MPI_Init.)
            snprintf(problem, sizeof problem,
                     "Slurm started %d tasks but MPI sees a world of 1: each task initialised MPI on its own. "
                     "Launch with srun --mpi=pmix (see srun --mpi=list) or mpirun",
                     ntasks);
        expect_same(&slurm_procid, "rank", rank, problem);
        expect_same(&slurm_ntasks, "world size", world, problem);
        expect_same(&slurm_localid, "local rank", local_rank, problem);
        // MPI's nodes must be Slurm's nodes: every rank of my shared-memory
        // group has my SLURM_NODEID. (The two may number the nodes in another
        // order, so compare within the group, not with MPI's node id.)
        int nodeid = env_int(&slurm_nodeid, problem), lowest = nodeid, highest = nodeid;
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, node_comm));
        CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &highest, 1, MPI_INT, MPI_MAX, node_comm));
        if (!problem[0] && lowest != highest)
            snprintf(problem, sizeof problem,
                     "the launcher and MPI disagree: MPI puts ranks with SLURM_NODEID %d and %d on one node", lowest,
                     highest);
        if (nodeid >= 0) node = nodeid;
        snprintf(source, sizeof source,
                 "placement from Slurm (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS) agrees with MPI");
    } else if (slurm_job.set) {
        snprintf(source, sizeof source,
                 "inside Slurm job %s but not started by srun (no SLURM_PROCID): placement from MPI", slurm_job.value);
    } else {
        snprintf(source, sizeof source,
                 "not under Slurm (no SLURM_PROCID): placement from MPI, node ids from its shared-memory groups");
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
