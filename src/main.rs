//! voodu-agent binary: parse flags, set up logging, run the command, map the result to an
//! exit code. All logic lives in the library.

fn main() -> std::process::ExitCode {
    voodu_agent::cli::main()
}
