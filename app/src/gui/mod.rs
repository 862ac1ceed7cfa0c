//! The desktop explorer: `allocview gui [FILE...]`. It draws the shared view-model with egui and
//! turns clicks, drags and keys into the same messages as the terminal explorer; the model does
//! the rest. Loads and replays run on worker threads; the window stays responsive.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};

use allocview_sim::policy::config::PolicyConfig;
use allocview_sim::policy::spec::PolicySpec;
use anyhow::{Result, anyhow};
use eframe::egui::{self, Color32, TextureHandle};

mod dump;
mod goto;
mod heap;
mod panels;
mod plan;
mod screenshot;
mod timeline;

use screenshot::Shot;

use crate::model::export;
use crate::model::heapmap::CellKind;
use crate::model::state::{AppState, Mode, RunStatus};
use crate::model::update::{Msg, update};
use crate::model::view::{ViewModel, Viewport, view_model};
use crate::model::workers::start_workers;
use crate::theme::{self, Rgb};

/// Arguments of `allocview gui`.
#[derive(Debug, clap::Args)]
pub struct GuiArgs {
    /// Traces to open; the first is explored, the others are overlaid on its timeline.
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub policies: crate::session::PolicyArgs,
    #[command(flatten)]
    pub input: crate::session::InputArgs,
    /// Once everything is loaded and replayed, save a screenshot of the window to this PNG and
    /// exit (for smoke tests and documentation).
    #[arg(long, value_name = "PNG")]
    pub screenshot: Option<PathBuf>,
    /// Open at this event: an event number, a time (`1.5s`) or `peak` (peak live bytes).
    #[arg(long, value_name = "WHERE")]
    pub goto: Option<String>,
    /// Window size, width x height in points.
    #[arg(long, default_value = "1400x900")]
    pub size: String,
    /// Open with the sites panel showing (memory by allocation site at the cursor).
    #[arg(long)]
    pub sites: bool,
    /// Run `tune` once the input is loaded (View > Tune): the best setting under `--limit` is
    /// added beside the default, both replayed, in the comparison view.
    #[arg(long)]
    pub tune: bool,
    /// Follow a trace that `record` is still writing: the view grows with the run (`F`
    /// follows the newest event again after the cursor was moved).
    #[arg(long)]
    pub follow: bool,
    /// The recording `record --gui` started, followed as `--follow` does.
    #[arg(skip)]
    pub follow_recording: Option<crate::model::live::Follow>,
}

fn col(rgb: Rgb) -> Color32 {
    Color32::from_rgb(rgb.0, rgb.1, rgb.2)
}

fn cell_color(k: CellKind) -> Color32 {
    match k {
        CellKind::Empty => Color32::TRANSPARENT,
        CellKind::Selected => col(theme::SELECTED),
        CellKind::Free => col(theme::FREE),
        CellKind::Dead => col(theme::DEAD),
        CellKind::Waste => col(theme::WASTE),
        CellKind::Used { class } => col(theme::class(class)),
    }
}

/// One open file: its model and the channel its workers report on.
struct Run {
    state: AppState,
    rx: Receiver<Msg>,
    /// Where the run's own background work reports (`tune`, started from the model's
    /// request).
    tx: std::sync::mpsc::Sender<Msg>,
    jobs: usize,
}

impl Run {
    fn start(
        path: &Path,
        names: &[PolicySpec],
        real: &[crate::real::RealSpec],
        config: &PolicyConfig,
        input: &crate::session::InputArgs,
        jobs: usize,
        launch: crate::model::state::Launch,
    ) -> Self {
        let lenient = input.lenient;
        let mut state = AppState::new(path, names, config.clone())
            .with_real(real)
            .launched(launch);
        state.window = input.window.clone();
        state.device = input.device;
        state.heap = input.heap.clone();
        let (tx, rx) = channel();
        start_workers(&state, lenient, jobs, &tx);
        Self {
            state,
            rx,
            tx,
            jobs,
        }
    }

    /// Applies the workers' messages; true when anything arrived.
    fn drain(&mut self) -> bool {
        let mut any = false;
        while let Ok(m) = self.rx.try_recv() {
            apply(&mut self.state, m);
            any = true;
        }
        // Asked for, and the input is loaded (before that, the search has nothing to read).
        if self.state.tune_requested && self.state.data.is_some() {
            self.state.tune_requested = false;
            crate::model::workers::start_tune(&self.state, self.jobs, &self.tx);
            any = true;
        }
        any
    }

    /// Still loading, replaying or searching. An input that failed to load is done: its
    /// policies stay pending for good (a screenshot waited on them forever).
    fn busy(&self) -> bool {
        let s = &self.state;
        s.load_error.is_none()
            && (s.data.is_none()
                || s.tune_running
                || s.policies
                    .iter()
                    .any(|p| matches!(p.status, RunStatus::Pending))
                || s.real
                    .iter()
                    .any(|r| matches!(r.status, crate::model::state::RealStatus::Pending)))
    }
}

fn apply(state: &mut AppState, msg: Msg) {
    let mut next = Some(msg);
    while let Some(m) = next.take() {
        next = update(state, m);
    }
}

struct GuiApp {
    runs: Vec<Run>,
    names: Vec<PolicySpec>,
    /// The real-allocator rows, drawn on the timeline beside the policies.
    real: Vec<crate::real::RealSpec>,
    config: PolicyConfig,
    input: crate::session::InputArgs,
    jobs: usize,
    /// Heap map zoom: the shown window of the held space, as fractions.
    heap_window: (f64, f64),
    textures: Vec<TextureHandle>,
    heat_texture: Option<TextureHandle>,
    dump_texture: Option<TextureHandle>,
    /// The timeline's visible x range in seconds (for the CSV export of the visible series).
    visible_s: (f64, f64),
    shot: Shot,
    exit_code: Arc<Mutex<Option<String>>>,
    /// `--goto`, applied to the first file opened.
    goto: Option<String>,
    /// `--follow`: the first file opened is a run being recorded (taken by that opening).
    follow: Option<crate::model::live::Follow>,
    /// To wake the window from the follower's thread.
    ctx: egui::Context,
    /// The menu bar's "go to" box, and whether `g` asked for the keyboard to go there.
    goto_text: String,
    focus_goto: bool,
}

impl GuiApp {
    fn primary(&self) -> Option<&AppState> {
        self.runs.first().map(|r| &r.state)
    }

    fn send(&mut self, msg: Msg) {
        if let Some(r) = self.runs.first_mut() {
            r.state.message = None;
            apply(&mut r.state, msg);
        }
    }

    fn open(&mut self, path: &Path, overlay: bool) {
        // A followed run grows without any input: its rounds wake the window.
        let follow = if overlay { None } else { self.follow.take() }.map(|mut f| {
            let ctx = self.ctx.clone();
            f.wake = Some(crate::model::live::Wake(Arc::new(move || {
                ctx.request_repaint();
            })));
            f
        });
        let run = Run::start(
            path,
            &self.names,
            &self.real,
            &self.config,
            &self.input,
            self.jobs,
            crate::model::state::Launch {
                goto: self.goto.take(),
                // An overlaid trace is a finished one.
                follow,
            },
        );
        if overlay && !self.runs.is_empty() {
            self.runs.push(run);
        } else {
            for old in &self.runs {
                old.state
                    .cancel
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
            self.runs = vec![run];
            self.heap_window = (0.0, 1.0);
        }
    }

    /// Opens the part of the trace the model asked for ([`AppState::reopen`]), in place of the
    /// one shown.
    fn open_asked_part(&mut self) {
        let Some(first) = self.runs.first_mut() else {
            return;
        };
        let Some(window) = first.state.reopen.take() else {
            return;
        };
        first
            .state
            .cancel
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let path = first.state.path.clone();
        let goto = first.state.reopen_goto.take();
        let input = crate::session::InputArgs {
            window,
            ..self.input.clone()
        };
        let run = Run::start(
            &path,
            &self.names,
            &self.real,
            &self.config,
            &input,
            self.jobs,
            crate::model::state::Launch { goto, follow: None },
        );
        if let Some(first) = self.runs.first_mut() {
            *first = run;
        }
        self.heap_window = (0.0, 1.0);
    }

    fn keys(&mut self, ctx: &egui::Context) {
        if ctx.egui_wants_keyboard_input() {
            return;
        }
        let pressed: Vec<Msg> = ctx.input(|i| {
            let mut out = Vec::new();
            let map = [
                (egui::Key::ArrowRight, Msg::Step(1)),
                (egui::Key::L, Msg::Step(1)),
                (egui::Key::ArrowLeft, Msg::Step(-1)),
                (egui::Key::H, Msg::Step(-1)),
                (egui::Key::PageDown, Msg::StepPage(1)),
                (egui::Key::J, Msg::StepPage(1)),
                (egui::Key::PageUp, Msg::StepPage(-1)),
                (egui::Key::K, Msg::StepPage(-1)),
                (egui::Key::CloseBracket, Msg::StepBucket(1)),
                (egui::Key::OpenBracket, Msg::StepBucket(-1)),
                (egui::Key::CloseCurlyBracket, Msg::OpenPart(1)),
                (egui::Key::OpenCurlyBracket, Msg::OpenPart(-1)),
                (egui::Key::Home, Msg::Home),
                (egui::Key::End, Msg::End),
                (egui::Key::N, Msg::NextMark),
                (egui::Key::P, Msg::CyclePolicy(1)),
                (egui::Key::C, Msg::ToggleCompare),
                (egui::Key::S, Msg::ToggleSites),
                (egui::Key::T, Msg::Tune),
                (egui::Key::F, Msg::FollowHead),
                (egui::Key::Period, Msg::CycleSite(1)),
                (egui::Key::Comma, Msg::CycleSite(-1)),
            ];
            for (key, msg) in map {
                if i.key_pressed(key) {
                    let shifted = i.modifiers.shift;
                    out.push(match (&msg, shifted) {
                        (Msg::NextMark, true) => Msg::PrevMark,
                        (Msg::CyclePolicy(_), true) => Msg::CyclePolicy(-1),
                        _ => msg,
                    });
                }
            }
            out
        });
        if ctx.input(|i| i.key_pressed(egui::Key::G)) {
            self.focus_goto = true;
        }
        for m in pressed {
            self.send(m);
        }
    }

    fn menu(&mut self, ui: &mut egui::Ui) {
        egui::MenuBar::new().ui(ui, |ui| {
            ui.menu_button("File", |ui| {
                if ui.button("Open…").clicked() {
                    if let Some(p) = rfd::FileDialog::new().pick_file() {
                        self.open(&p, false);
                    }
                    ui.close();
                }
                if ui.button("Overlay another run…").clicked() {
                    if let Some(p) = rfd::FileDialog::new().pick_file() {
                        self.open(&p, true);
                    }
                    ui.close();
                }
                ui.separator();
                if ui.button("Export PNG of the window…").clicked() {
                    if let Some(p) = rfd::FileDialog::new()
                        .add_filter("PNG", &["png"])
                        .set_file_name("allocview.png")
                        .save_file()
                    {
                        self.shot = Shot::Pending {
                            path: p,
                            settle_frames: 1,
                        };
                    }
                    ui.close();
                }
                if ui.button("Export CSV of the visible series…").clicked() {
                    let msg = self.export_csv();
                    if let Some(r) = self.runs.first_mut() {
                        r.state.message = Some(msg);
                    }
                    ui.close();
                }
                ui.separator();
                if ui.button("Quit").clicked() {
                    ui.ctx().send_viewport_cmd(egui::ViewportCommand::Close);
                }
            });
            ui.menu_button("View", |ui| {
                let parts = self
                    .primary()
                    .is_some_and(|s| s.data.as_ref().is_some_and(|d| d.part.is_some()));
                if ui
                    .add_enabled(parts, egui::Button::new("Next part of the trace (})"))
                    .clicked()
                {
                    self.send(Msg::OpenPart(1));
                    ui.close();
                }
                if ui
                    .add_enabled(parts, egui::Button::new("Previous part of the trace ({)"))
                    .clicked()
                {
                    self.send(Msg::OpenPart(-1));
                    ui.close();
                }
                if ui
                    .button("Tune: add the allocator's best setting as a policy (T)")
                    .clicked()
                {
                    self.send(Msg::Tune);
                    ui.close();
                }
                ui.separator();
                let compare = self.primary().is_some_and(|s| s.mode == Mode::Compare);
                if ui
                    .selectable_label(compare, "Compare policies side by side (c)")
                    .clicked()
                {
                    self.send(Msg::ToggleCompare);
                    ui.close();
                }
                let sites = self.primary().is_some_and(|s| s.sites.open);
                if ui
                    .selectable_label(sites, "Memory by allocation site (s)")
                    .clicked()
                {
                    self.send(Msg::ToggleSites);
                    ui.close();
                }
                ui.separator();
                let selected = self.primary().map_or(0, |s| s.selected);
                for (i, name) in self.names.clone().iter().enumerate() {
                    if ui.selectable_label(selected == i, name.label()).clicked() {
                        self.send(Msg::CyclePolicy(i as i64 - selected as i64));
                        ui.close();
                    }
                }
            });
            ui.menu_button("Help", |ui| {
                for (k, d) in crate::model::view::HELP {
                    ui.label(format!("{k:<16} {d}"));
                }
            });
            self.goto_box(ui);
        });
    }

    fn export_csv(&self) -> String {
        let Some(state) = self.primary() else {
            return "nothing to export".to_owned();
        };
        let Some(path) = rfd::FileDialog::new()
            .add_filter("CSV", &["csv"])
            .set_file_name("allocview-series.csv")
            .save_file()
        else {
            return "export cancelled (or no file dialog available)".to_owned();
        };
        let span_s = state.bucketing().map_or(1.0, |b| b.span_ns as f64 / 1e9);
        let window = (
            (self.visible_s.0 / span_s).clamp(0.0, 1.0),
            (self.visible_s.1 / span_s).clamp(0.0, 1.0),
        );
        let csv = match export::series_csv(state, window) {
            Ok(csv) => csv,
            Err(e) => return format!("could not export the series: {e:#}"),
        };
        match crate::safe_write::write_bytes(
            &path,
            csv.as_bytes(),
            state.data.as_ref().map(|d| d.path.as_path()).as_slice(),
        ) {
            Ok(()) => format!("wrote {}", path.display()),
            Err(e) => format!("could not write {}: {e}", path.display()),
        }
    }
}

impl eframe::App for GuiApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        let ctx = ui.ctx().clone();
        self.take_input(&ctx);
        let vp = Viewport {
            timeline_points: 2048,
            heap_cells: 64 * 64,
            event_rows: 8,
            heat_columns: 512,
            plan_size: (640, 320),
        };
        let vms: Vec<ViewModel> = self
            .runs
            .iter()
            .map(|r| view_model(&r.state, &vp))
            .collect();

        egui::Panel::top("menu").show(ui, |ui| self.menu(ui));
        let status = vms.first().map(|vm| {
            vm.status.message.clone().map_or_else(
                || format!("{}    {}", vm.status.left, vm.status.right),
                |m| format!("{m}    {}", vm.status.right),
            )
        });
        egui::Panel::bottom("status").show(ui, |ui| {
            ui.label(
                status.unwrap_or_else(|| "File > Open, or drop a trace on the window".to_owned()),
            );
        });
        let Some(vm) = vms.first().cloned() else {
            egui::CentralPanel::default().show(ui, |ui| {
                ui.centered_and_justified(|ui| {
                    ui.heading("allocview: File > Open, or drop a trace here")
                });
            });
            return;
        };
        if let Some(err) = &vm.error {
            egui::CentralPanel::default().show(ui, |ui| {
                ui.colored_label(col(theme::OOM), "could not load the trace");
                ui.label(err);
            });
        } else if let Some((label, frac)) = &vm.loading {
            egui::CentralPanel::default().show(ui, |ui| {
                ui.add_space(ui.available_height() / 2.5);
                ui.add(
                    egui::ProgressBar::new(*frac as f32)
                        .text(label.as_str())
                        .show_percentage(),
                );
            });
        } else if let Some(p) = &vm.plan {
            egui::Panel::top("plan-text").show(ui, |ui| {
                ui.heading("memory plan");
                for l in &p.lines {
                    ui.monospace(l);
                }
            });
            let state = self.runs.first().map(|r| &r.state);
            egui::CentralPanel::default().show(ui, |ui| plan::plan_ui(ui, p, state));
        } else {
            self.explorer_ui(ui, &ctx, &vm, &vms);
        }

        self.finish_frame(&ctx);
    }
}

impl GuiApp {
    /// What came in since the last frame: the workers' reports, a part the model asked to
    /// open, files dropped on the window, and keys.
    fn take_input(&mut self, ctx: &egui::Context) {
        for r in &mut self.runs {
            r.drain();
        }
        self.open_asked_part();
        if self.runs.iter().any(|r| r.state.scanning()) {
            // The whole trace's strip fills in as the background read goes on.
            ctx.request_repaint_after(std::time::Duration::from_millis(250));
        }
        let dropped: Vec<PathBuf> = ctx.input(|i| {
            i.raw
                .dropped_files
                .iter()
                .map(|f| f.path().to_path_buf())
                .collect()
        });
        if let Some(first) = dropped.first() {
            self.open(first, false);
            for more in dropped.iter().skip(1) {
                self.open(more, true);
            }
        }
        self.keys(ctx);
    }

    /// The explorer's panels for an input with a history (`vms`: every open run's, for the
    /// timeline's overlay), or a dump's heap and bins beside its text.
    fn explorer_ui(
        &mut self,
        ui: &mut egui::Ui,
        ctx: &egui::Context,
        vm: &ViewModel,
        vms: &[ViewModel],
    ) {
        // Panels start in proportion to the window, so a small window keeps room for
        // the heap map.
        let screen = ctx.content_rect().size();
        if vm.timeline.is_some() {
            egui::Panel::top("timeline")
                .resizable(true)
                .min_size(100.0)
                .default_size((screen.y * 0.24).clamp(120.0, 260.0))
                .show(ui, |ui| self.timeline_ui(ui, vms));
        } else {
            egui::Panel::top("dump").show(ui, |ui| {
                ui.heading("TensorFlow BFC dump");
                for (i, l) in vm.dump_lines.iter().enumerate() {
                    if i == 0 {
                        ui.colored_label(col(theme::OOM), l);
                    } else {
                        ui.label(l);
                    }
                }
            });
        }
        // A dump is one moment: its chunks fill the window beside its bins, with no empty
        // event list or class history below.
        let dump = self
            .runs
            .first()
            .and_then(|r| r.state.data.clone())
            .filter(|d| d.is_empty() && d.dump.is_some());
        if let Some(data) = dump
            && let Some(d) = &data.dump
        {
            egui::Panel::right("side")
                .resizable(true)
                .min_size(300.0)
                .default_size(420.0)
                .show(ui, |ui| self.side_ui(ui, vm));
            egui::CentralPanel::default().show(ui, |ui| {
                dump::dump_heap_ui(ui, vm, d, &mut self.dump_texture);
            });
            return;
        }
        // The heap map, the view the tool is about, keeps the most room.
        egui::Panel::bottom("bottom")
            .resizable(true)
            .min_size(110.0)
            .default_size((screen.y * 0.25).clamp(130.0, 280.0))
            .show(ui, |ui| self.bottom_ui(ui, vm));
        if vm.compare {
            egui::CentralPanel::default().show(ui, |ui| self.heap_ui(ui, vm));
        } else {
            egui::Panel::right("side")
                .resizable(true)
                .min_size(220.0)
                .default_size((screen.x * 0.27).clamp(260.0, 420.0))
                .show(ui, |ui| self.side_ui(ui, vm));
            egui::CentralPanel::default().show(ui, |ui| self.heap_ui(ui, vm));
        }
    }
}

/// The window icon, from `assets/icon.png` embedded in the binary.
fn window_icon() -> Option<egui::IconData> {
    let img = image::load_from_memory(include_bytes!("../../../assets/icon.png"))
        .ok()?
        .to_rgba8();
    Some(egui::IconData {
        width: img.width(),
        height: img.height(),
        rgba: img.into_raw(),
    })
}

/// Runs `allocview gui`.
///
/// # Errors
/// When no window can be opened (no display) or a screenshot could not be saved.
pub fn run(args: &GuiArgs) -> Result<()> {
    let (names, real) = args
        .policies
        .explorer_specs_and_real(args.files.first().map(PathBuf::as_path))?;
    let config = args.policies.config()?;
    let jobs = args.policies.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let follow = args
        .follow_recording
        .clone()
        .or_else(|| args.follow.then(crate::model::live::Follow::default));
    if follow.is_some() {
        crate::model::live::check_follow(&args.input).map_err(|e| anyhow!(e))?;
        crate::model::live::yield_to_the_program();
    }
    // A followed run's file may not be there yet.
    for f in args.files.iter().skip(usize::from(follow.is_some())) {
        std::fs::File::open(f).map_err(|e| anyhow!("cannot open {}: {e}", f.display()))?;
    }
    let (w, h) = args
        .size
        .split_once('x')
        .and_then(|(w, h)| Some((w.parse::<f32>().ok()?, h.parse::<f32>().ok()?)))
        .ok_or_else(|| anyhow!("--size must look like 1400x900"))?;
    let exit = Arc::new(Mutex::new(None));
    let app_exit = Arc::clone(&exit);
    let files = args.files.clone();
    let input = args.input.clone();
    let shot = args.screenshot.clone();
    let goto = args.goto.clone();
    let sites = args.sites;
    let tune = args.tune;
    let mut viewport = egui::ViewportBuilder::default()
        .with_inner_size([w, h])
        .with_title("allocview")
        .with_drag_and_drop(true);
    if let Some(icon) = window_icon() {
        viewport = viewport.with_icon(icon);
    }
    let options = eframe::NativeOptions {
        viewport,
        ..eframe::NativeOptions::default()
    };
    eframe::run_native(
        "allocview",
        options,
        Box::new(move |cc| {
            let mut app = GuiApp {
                runs: Vec::new(),
                names,
                real,
                config,
                input,
                jobs,
                heap_window: (0.0, 1.0),
                textures: Vec::new(),
                heat_texture: None,
                dump_texture: None,
                visible_s: (0.0, 0.0),
                shot: shot.map_or(Shot::None, |path| Shot::Pending {
                    path,
                    settle_frames: 3,
                }),
                exit_code: app_exit,
                goto,
                follow,
                ctx: cc.egui_ctx.clone(),
                goto_text: String::new(),
                focus_goto: false,
            };
            for (i, f) in files.iter().enumerate() {
                app.open(f, i > 0);
            }
            if sites {
                app.send(Msg::ToggleSites);
            }
            if tune {
                app.send(Msg::Tune);
            }
            Ok(Box::new(app))
        }),
    )
    .map_err(|e| anyhow!("could not open the window: {e}"))?;
    if let Some(path) = &args.screenshot {
        match exit.lock().ok().and_then(|g| g.clone()) {
            Some(err) if !err.is_empty() => return Err(anyhow!("screenshot failed: {err}")),
            Some(_) => eprintln!("saved {}", path.display()),
            None => return Err(anyhow!("the window closed before the screenshot was taken")),
        }
    }
    Ok(())
}
