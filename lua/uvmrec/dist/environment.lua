-- uvmrec.dist.environment: the job as the environment describes it, without joining it or loading
-- the engine (the command-line layer notes a rank's exit with it): {rank, world, local_rank,
-- launcher = "mpi" | "uvmrec" | nil}. mpirun's variables (OpenMPI's, or PMI's) come first, then
-- those `uvmrec launch` sets; none: one rank.
return function()
  local function n(name) return tonumber(os.getenv(name) or "") end
  if n("OMPI_COMM_WORLD_SIZE") then
    return { rank = n("OMPI_COMM_WORLD_RANK"), world = n("OMPI_COMM_WORLD_SIZE"),
             local_rank = n("OMPI_COMM_WORLD_LOCAL_RANK"), launcher = "mpi" }
  end
  if n("PMI_SIZE") then
    return { rank = n("PMI_RANK"), world = n("PMI_SIZE"), local_rank = n("MPI_LOCALRANKID"), launcher = "mpi" }
  end
  if n("UVMREC_WORLD") then
    return { rank = n("UVMREC_RANK"), world = n("UVMREC_WORLD"), local_rank = n("UVMREC_LOCAL_RANK"),
             launcher = "uvmrec" }
  end
  return { rank = 0, world = 1, local_rank = 0 }
end
