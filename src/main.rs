//! voodu-agent binary: parse flags, set up logging, run the command, map the result to an
//! exit code. All logic lives in the library.

/// mimalloc rather than glibc's malloc: a commit's load makes millions of small allocations,
/// and glibc's bins made the load of 10,000 resources superlinear (malloc_consolidate and
/// unlink_chunk rose from 4 % to 15 % of the CPU profile between 1,000 and 10,000 resources;
/// benches/plan.rs, README "Sizing"). SQLite's own C allocations still go to glibc. Built
/// with `no_thp`: with transparent huge pages mimalloc's arenas made an idle agent's heap
/// 19 MiB resident instead of 4.5 MiB.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    voodu_agent::cli::main()
}
