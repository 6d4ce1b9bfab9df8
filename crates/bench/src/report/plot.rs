//! The font every benchmark plot draws its text with, loaded once per process.
//!
//! plotters' `ab_glyph` backend draws text only with fonts registered at run time; all plots use
//! the family name `"sans-serif"`, registered here from DejaVu Sans (Debian `fonts-dejavu-core`,
//! installed by scripts/setup.sh).

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Result};
use plotters::style::FontStyle;

/// The font plotters draws all text with (package `fonts-dejavu-core`).
pub const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Registers [`FONT_PATH`] as `"sans-serif"`; later calls return the first call's outcome.
pub fn register_font() -> Result<()> {
    static REGISTERED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let registered = REGISTERED.get_or_init(|| {
        let bytes = std::fs::read(FONT_PATH).map_err(|error| {
            format!("cannot read {FONT_PATH} ({error}); install the Debian package fonts-dejavu-core")
        })?;
        // plotters keeps fonts for the whole process and wants 'static bytes: leak them once.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{FONT_PATH} is not a usable TrueType font"))
    });
    registered.clone().map_err(|message| anyhow!(message))
}

/// Fails early with the package to install when the font is missing (for a run's start, so a
/// long benchmark does not end without its plot).
pub fn check_font() -> Result<()> {
    if !Path::new(FONT_PATH).exists() {
        bail!("{FONT_PATH} is missing: install the Debian package fonts-dejavu-core (no PNG will be written)");
    }
    Ok(())
}

/// A plotters drawing error as an `anyhow` error.
pub fn plot_error(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("plotting: {error}")
}
