use bloomery::cli;
use std::process::ExitCode;

fn main() -> ExitCode {
    let parsed = match cli::parse_process() {
        Ok(parsed) => parsed,
        Err(failure) => {
            for line in &failure.warnings {
                eprintln!("{line}");
            }
            eprintln!("{}", failure.message);
            return ExitCode::from(cli::Failure::EXIT_CODE);
        }
    };
    for line in parsed.warnings.iter().chain(&parsed.not_built_warnings()) {
        eprintln!("{line}");
    }
    if let Some(out) = parsed.exit_output() {
        print!("{}", out.stdout);
        eprint!("{}", out.stderr);
        return ExitCode::from(out.code);
    }
    match bloomery::launch::serve(parsed.config, parsed.placement) {
        Ok(()) => ExitCode::SUCCESS,
        Err(bloomery::launch::LaunchError::Argument(refusal)) => {
            eprintln!("{refusal}");
            ExitCode::from(cli::Failure::EXIT_CODE)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
