//! PNG copies of the plots for `--images`, rendered from their SVG with
//! resvg. Text needs a font: the system's fonts are searched (Debian's
//! fonts-dejavu-core provides DejaVu Sans), and when there is none the
//! rasterizer refuses with one line saying what to install, rather than
//! writing plots without labels.

use std::sync::Arc;

/// Why a plot could not be rendered as PNG.
#[derive(Debug, thiserror::Error)]
pub enum PngError {
    /// No usable font on this system.
    #[error("no font found for the PNG plots; install one (on Debian: apt-get install fonts-dejavu-core)")]
    NoFont,
    /// The SVG did not parse (a bug in the plot writer).
    #[error("cannot render plot SVG: {0}")]
    Svg(String),
    /// Encoding failed.
    #[error("cannot encode PNG: {0}")]
    Encode(String),
}

/// Renders SVG plots to PNG at twice their nominal size.
pub struct Rasterizer {
    options: resvg::usvg::Options<'static>,
}

impl Rasterizer {
    /// Loads the system's fonts; fails with [`PngError::NoFont`] if none.
    pub fn new() -> Result<Rasterizer, PngError> {
        let mut db = resvg::usvg::fontdb::Database::new();
        db.load_system_fonts();
        let family = db
            .faces()
            .find(|f| f.families.iter().any(|(n, _)| n == "DejaVu Sans"))
            .or_else(|| db.faces().next())
            .and_then(|f| f.families.first().map(|(n, _)| n.clone()))
            .ok_or(PngError::NoFont)?;
        let options = resvg::usvg::Options {
            font_family: family,
            fontdb: Arc::new(db),
            ..resvg::usvg::Options::default()
        };
        Ok(Rasterizer { options })
    }

    /// The PNG bytes of an SVG document.
    pub fn png(&self, svg: &str) -> Result<Vec<u8>, PngError> {
        let tree = resvg::usvg::Tree::from_str(svg, &self.options)
            .map_err(|e| PngError::Svg(e.to_string()))?;
        let scale = 2.0;
        let size = tree.size();
        let (w, h) = (
            (size.width() * scale).ceil() as u32,
            (size.height() * scale).ceil() as u32,
        );
        let mut pixmap = resvg::tiny_skia::Pixmap::new(w, h)
            .ok_or_else(|| PngError::Encode(format!("bad image size {w}x{h}")))?;
        resvg::render(
            &tree,
            resvg::tiny_skia::Transform::from_scale(scale, scale),
            &mut pixmap.as_mut(),
        );
        pixmap
            .encode_png()
            .map_err(|e| PngError::Encode(e.to_string()))
    }
}
