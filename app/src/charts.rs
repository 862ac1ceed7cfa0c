//! What every PNG chart shares (`report`'s charts and heap maps, `spill`'s plot): the fonts
//! embedded in the binary, the theme's colours, plotting errors.

use anyhow::{Result, anyhow};
use plotters::prelude::*;

use crate::theme::Rgb;

/// A theme colour for plotters.
pub(crate) fn rgb(c: Rgb) -> RGBColor {
    RGBColor(c.0, c.1, c.2)
}

/// Registers the embedded fonts under the names the charts ask for.
pub(crate) fn register_fonts() -> Result<()> {
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        epaint_default_fonts::UBUNTU_LIGHT,
    )
    .map_err(|_| anyhow!("the embedded chart font is invalid"))?;
    plotters::style::register_font(
        "monospace",
        FontStyle::Normal,
        epaint_default_fonts::HACK_REGULAR,
    )
    .map_err(|_| anyhow!("the embedded chart font is invalid"))?;
    Ok(())
}

/// A plotting error, said as one.
pub(crate) fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a chart: {e:?}")
}
