//! `gui --screenshot`: once everything is loaded and replayed and a couple of frames have
//! drawn it, the window is captured to a PNG (written safely) and closed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use eframe::egui::{self, ColorImage};

use super::{GuiApp, Run};

/// What the screenshot option is waiting for.
pub(super) enum Shot {
    None,
    Pending {
        path: PathBuf,
        settle_frames: u32,
    },
    Requested {
        done: Arc<AtomicBool>,
        error: Arc<Mutex<Option<String>>>,
    },
}

impl GuiApp {
    /// Repaints while workers run, and takes the screenshot when asked and everything is done.
    pub(super) fn finish_frame(&mut self, ctx: &egui::Context) {
        let busy = self.runs.iter().any(Run::busy);
        if busy {
            ctx.request_repaint_after(std::time::Duration::from_millis(100));
        }
        self.screenshot_step(ctx, busy);
    }
}

impl GuiApp {
    fn screenshot_step(&mut self, ctx: &egui::Context, busy: bool) {
        match &mut self.shot {
            Shot::None => {}
            Shot::Pending {
                path,
                settle_frames,
            } => {
                if busy {
                    return;
                }
                // Let a couple of frames draw the finished state before capturing it.
                if *settle_frames > 0 {
                    *settle_frames -= 1;
                    ctx.request_repaint();
                    return;
                }
                let path = path.clone();
                let done = Arc::new(AtomicBool::new(false));
                let error = Arc::new(Mutex::new(None));
                let (d, e, c) = (Arc::clone(&done), Arc::clone(&error), ctx.clone());
                ctx.request_screenshot(move |img| {
                    if let Err(err) = save_png(&path, &img)
                        && let Ok(mut slot) = e.lock()
                    {
                        *slot = Some(err);
                    }
                    d.store(true, Ordering::SeqCst);
                    c.request_repaint();
                });
                self.shot = Shot::Requested { done, error };
                ctx.request_repaint();
            }
            Shot::Requested { done, error } => {
                if done.load(Ordering::SeqCst) {
                    if let (Ok(mut out), Ok(err)) = (self.exit_code.lock(), error.lock()) {
                        *out = Some(err.clone().unwrap_or_default());
                    }
                    self.shot = Shot::None;
                    ctx.send_viewport_cmd(egui::ViewportCommand::Close);
                } else {
                    ctx.request_repaint();
                }
            }
        }
    }
}

fn save_png(path: &Path, img: &ColorImage) -> std::result::Result<(), String> {
    let [w, h] = img.size;
    let mut rgba = Vec::with_capacity(w * h * 4);
    for p in &img.pixels {
        rgba.extend_from_slice(&p.to_srgba_unmultiplied());
    }
    let buf = image::RgbaImage::from_raw(
        u32::try_from(w).map_err(|e| e.to_string())?,
        u32::try_from(h).map_err(|e| e.to_string())?,
        rgba,
    )
    .ok_or("screenshot size mismatch")?;
    crate::safe_write::write_atomically(path, &[], |w| {
        buf.write_to(
            w,
            image::ImageFormat::from_path(path).unwrap_or(image::ImageFormat::Png),
        )
        .map_err(std::io::Error::other)
    })
    .map_err(|e| e.to_string())
}
