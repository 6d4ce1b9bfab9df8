//! The pooler's configuration commands: `bypass check-config FILE` (every problem of a file in
//! one run) and `bypass import-pgbouncer pgbouncer.ini` (an equivalent `bypass.toml`, and what
//! could not be translated).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use bypass_pooler::{Config, ConfigError};
use clap::Args;

#[derive(Args)]
pub struct ImportArgs {
    /// The PgBouncer configuration to translate.
    ini: PathBuf,
    /// Where to write the Bypass configuration.
    #[arg(long, default_value = "bypass.toml")]
    output: PathBuf,
    /// Overwrite `--output` if it exists.
    #[arg(long)]
    force: bool,
}

/// Checks a configuration file: every problem listed, or a one-line summary.
pub fn check_config(path: &Path) -> Result<()> {
    match Config::load(path) {
        Ok(valid) => {
            println!(
                "{}: valid ({} database entries, {} users, listening on {})",
                path.display(),
                valid.config.databases.len(),
                valid.auth.len(),
                valid.listen_addr
            );
            Ok(())
        }
        Err(error) => bail!("{}", describe(path, &error)),
    }
}

/// A configuration error as the operator reads it: the file, every problem once, and a hint
/// when the file is a PgBouncer one.
pub fn describe(path: &Path, error: &ConfigError) -> String {
    let mut text = format!("{}: {error}", path.display());
    let looks_like_pgbouncer =
        std::fs::read_to_string(path).is_ok_and(|content| bypass_pooler::import::looks_like_pgbouncer_ini(&content));
    if looks_like_pgbouncer {
        text.push_str(&format!(
            "\n{} looks like a pgbouncer.ini: translate it with `bypass import-pgbouncer {}`",
            path.display(),
            path.display()
        ));
    }
    text
}

/// Writes the translation of a `pgbouncer.ini`, lists what it could not translate, and checks
/// the result (the auth file and TLS files it names must exist).
pub fn import(args: ImportArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.ini).with_context(|| format!("reading {}", args.ini.display()))?;
    let folder = args.ini.parent().map(Path::to_path_buf).unwrap_or_default();
    let folder = std::fs::canonicalize(&folder).unwrap_or(folder);
    let import = bypass_pooler::import::from_pgbouncer_ini(&text, &folder);
    if args.output.exists() && !args.force {
        bail!("{} exists; pass --force to overwrite it or --output to write elsewhere", args.output.display());
    }
    std::fs::write(&args.output, &import.toml).with_context(|| format!("writing {}", args.output.display()))?;
    println!("wrote {}", args.output.display());
    if import.untranslated.is_empty() {
        println!("every setting was translated");
    } else {
        println!("not translated ({}):", import.untranslated.len());
        for line in &import.untranslated {
            println!("  - {line}");
        }
    }
    match Config::load(&args.output) {
        Ok(_) => println!("{}: valid", args.output.display()),
        Err(error) => println!("check before use: {}", describe(&args.output, &error)),
    }
    Ok(())
}
