//! `allocview plan FILE [--planner a,b] [--capacity N] [--json] [--out plan.csv]`: static
//! memory planners on one set of buffers, against the max-live lower bound.
//!
//! FILE is a minimalloc CSV, a JSON graph plan, a malloc trace (each allocation one buffer) or
//! a TensorFlow memory log (one step's tensors). Every plan is checked by the simulator's
//! validator before anything is printed or written.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use allocview_loaders::plan::{MemoryPlan, PlanBuffers, from_loaded, minimalloc};
use allocview_sim::plan::{
    Buffer, PLANNER_NAMES, Plan, PlanError, PlanOptions, max_live_buffers, max_live_bytes,
    run_planner, validate,
};
use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::format;
use crate::model::plan_view::{self, PlanCell, PlanGrid};
use crate::safe_write;
use crate::session::InputArgs;
use crate::session::input::load_input;

/// Most buffers on which the default planner set includes `shared-objects`: it compares each
/// buffer with every shared object (quadratic: 446 s on 100,000 buffers, about 1 s on 5,000),
/// and its own docs say it is not for whole malloc traces. Named with --planner, it runs.
pub const SHARED_OBJECTS_DEFAULT_MAX_BUFFERS: usize = 5_000;

/// Most buffer-object comparisons (buffers times the most buffers live at once, which
/// bounds its objects from below) on which the default set includes `greedy-by-breadth`: it
/// compares each buffer with every object, so 262,144 buffers all live at once took 620 s (a
/// debug build) while every other planner took at most 3 s. Named with --planner, it runs.
pub const BREADTH_DEFAULT_MAX_COMPARISONS: u128 = 1 << 31;

/// What `search` gets when no `--time-budget` is given.
pub const DEFAULT_SEARCH_BUDGET_S: f64 = 10.0;

/// Arguments of `allocview plan`.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// A minimalloc CSV, a JSON graph plan, a malloc trace or a TensorFlow memory log.
    pub file: PathBuf,
    /// Planners to run, comma-separated (default: all). Known: naive, greedy-by-size,
    /// greedy-by-breadth, shared-objects, pushdown, pushdown-best-fit, search.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub planner: Vec<String>,
    /// Pool size to fit in (e.g. 1048576, 512MiB): says whether each plan fits, and makes
    /// `search` look for any plan within it instead of the smallest.
    #[arg(long, value_parser = crate::units::parse_bytes, value_name = "BYTES")]
    pub capacity: Option<u64>,
    /// Alignment of every buffer's offset, in bytes (a power of two), on top of the file's own.
    #[arg(long, default_value_t = 1, value_name = "BYTES")]
    pub align: u64,
    /// Seconds `search` may take before it returns its best plan, unproven (default 10).
    #[arg(long, value_name = "SECONDS")]
    pub time_budget: Option<f64>,
    /// Memory logs: the step to plan (default: the step with the most allocations).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub step: Option<i64>,
    /// Write the chosen plan (the first planner named with --planner, else the smallest) as a
    /// minimalloc CSV with an `offset` column.
    #[arg(long, value_name = "CSV")]
    pub out: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// After the table, draw the chosen plan (as for --out): time across, address up, one
    /// letter per buffer, with the lower-bound line; the size in characters (default 100x24).
    #[arg(long, value_name = "WxH", num_args = 0..=1, default_missing_value = "100x24")]
    pub picture: Option<String>,
    #[command(flatten)]
    pub input: InputArgs,
}

impl PlanArgs {
    /// The planner names to run, validated, in the order given.
    fn names(&self) -> Result<Vec<&'static str>> {
        if self.planner.is_empty() || self.planner.iter().any(|p| p == "all") {
            return Ok(PLANNER_NAMES.to_vec());
        }
        let mut out = Vec::new();
        for p in &self.planner {
            let Some(&name) = PLANNER_NAMES.iter().find(|&&n| n == p.trim()) else {
                bail!(
                    "unknown planner {p:?}; known planners: {}",
                    PLANNER_NAMES.join(", ")
                );
            };
            if !out.contains(&name) {
                out.push(name);
            }
        }
        Ok(out)
    }

    fn options(&self) -> Result<PlanOptions> {
        if !self.align.is_power_of_two() {
            bail!("--align must be a power of two, got {}", self.align);
        }
        let budget_s = self.time_budget.unwrap_or(DEFAULT_SEARCH_BUDGET_S);
        let time_budget = Duration::try_from_secs_f64(budget_s)
            .with_context(|| format!("--time-budget {budget_s}: expected seconds >= 0"))?;
        Ok(PlanOptions {
            align_bytes: self.align,
            capacity_bytes: self.capacity,
            time_budget: Some(time_budget),
        })
    }
}

/// One planner's outcome, validated.
#[derive(Clone, Debug)]
pub struct PlannerRun {
    pub name: &'static str,
    pub plan: Plan,
    pub seconds: f64,
    pub fits: Option<bool>,
    pub proven_optimal: Option<bool>,
}

/// A plan error in the file's terms: buffer indices become their ids.
fn describe(err: &PlanError, ids: &[String]) -> String {
    let id = |i: usize| {
        ids.get(i)
            .map_or_else(|| format!("#{i}"), |s| format!("{s:?} (#{i})"))
    };
    match err {
        PlanError::Overlap { a, b } => format!(
            "buffers {} and {} are live at the same time and overlap in memory",
            id(*a),
            id(*b)
        ),
        PlanError::BadLifetime {
            index,
            lower,
            upper,
        } => format!(
            "buffer {}: lifetime [{lower}, {upper}) ends before it starts",
            id(*index)
        ),
        PlanError::BadOverwrite { index, reason } => {
            format!("buffer {}: bad overwrite spec: {reason}", id(*index))
        }
        PlanError::Misaligned {
            index,
            offset_bytes,
            align_bytes,
        } => format!(
            "buffer {}: offset {offset_bytes} is not a multiple of {align_bytes}",
            id(*index)
        ),
        PlanError::BeyondTotal {
            index,
            end_bytes,
            total_bytes,
        } => format!(
            "buffer {}: ends at {end_bytes}, beyond the plan's {total_bytes} B",
            id(*index)
        ),
        PlanError::OverwriteMisplaced {
            index,
            offset_bytes,
            expected_bytes,
        } => format!(
            "buffer {}: overwrite child at {offset_bytes}, declared at {expected_bytes}",
            id(*index)
        ),
        other => other.to_string(),
    }
}

/// Runs the planners in turn (one at a time, so their times are comparable) and validates
/// every plan.
///
/// # Errors
/// A planner's input error, or a plan the validator rejects (a planner bug).
pub fn run_planners(
    pb: &PlanBuffers,
    names: &[&'static str],
    opts: &PlanOptions,
) -> Result<Vec<PlannerRun>> {
    let mut runs = Vec::with_capacity(names.len());
    for &name in names {
        let start = Instant::now();
        let result = run_planner(name, &pb.buffers, opts)
            .map_err(|e| anyhow::anyhow!("planner {name}: {}", describe(&e, &pb.ids)))?;
        let seconds = start.elapsed().as_secs_f64();
        validate(&pb.buffers, &result.plan).map_err(|e| {
            anyhow::anyhow!(
                "planner {name} produced an invalid plan: {}",
                describe(&e, &pb.ids)
            )
        })?;
        runs.push(PlannerRun {
            name,
            plan: result.plan,
            seconds,
            fits: result.fits,
            proven_optimal: result.proven_optimal,
        });
    }
    Ok(runs)
}

/// The plan the file itself gives (a minimalloc solution), validated: its height.
fn given_plan(pb: &PlanBuffers) -> Result<Option<Plan>> {
    let Some(offsets) = &pb.planned_offsets else {
        return Ok(None);
    };
    let total_bytes = pb
        .buffers
        .iter()
        .zip(offsets)
        .filter(|(b, _)| b.needs_memory())
        .map(|(b, &o)| o.saturating_add(b.size_bytes))
        .max()
        .unwrap_or(0);
    let plan = Plan {
        offsets: offsets.clone(),
        total_bytes,
    };
    validate(&pb.buffers, &plan).map_err(|e| {
        anyhow::anyhow!(
            "the offsets in the file are not a valid plan: {}",
            describe(&e, &pb.ids)
        )
    })?;
    Ok(Some(plan))
}

/// Loads FILE as a plan (converting traces and memory logs), printing notes to stderr.
///
/// # Errors
/// When the file cannot be loaded or has nothing to plan.
pub fn load_plan(path: &Path, input: &InputArgs, step: Option<i64>) -> Result<MemoryPlan> {
    let loaded = load_input(path, input)?;
    let converted = !matches!(loaded, allocview_loaders::Loaded::Plan(_));
    let plan = from_loaded(loaded, path, step)
        .with_context(|| format!("while planning {}", path.display()))?;
    if converted {
        // A plan file's notes were printed by the load already.
        for n in &plan.notes {
            eprintln!("note: {n}");
        }
    }
    Ok(plan)
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Takes out of the default set `names` the planners whose cost on `buffers` would dwarf the
/// others', saying so on stderr; returns each one's `skipped_planners` entry.
fn leave_out_costly(names: &mut Vec<&str>, buffers: &[Buffer]) -> Vec<Value> {
    let mut reasons = Vec::new();
    if buffers.len() > SHARED_OBJECTS_DEFAULT_MAX_BUFFERS {
        reasons.push((
            "shared-objects",
            format!(
                "shared-objects is quadratic and left out of the default set on {} buffers \
                 (more than {})",
                format::count(buffers.len() as u64),
                format::count(SHARED_OBJECTS_DEFAULT_MAX_BUFFERS as u64)
            ),
        ));
    }
    let most_live = max_live_buffers(buffers);
    if buffers.len() as u128 * most_live as u128 > BREADTH_DEFAULT_MAX_COMPARISONS {
        reasons.push((
            "greedy-by-breadth",
            format!(
                "greedy-by-breadth compares each buffer with every object and is left out of \
                 the default set on {} buffers with {} live at once (more than {} comparisons)",
                format::count(buffers.len() as u64),
                format::count(most_live as u64),
                format::count(BREADTH_DEFAULT_MAX_COMPARISONS as u64)
            ),
        ));
    }
    reasons
        .into_iter()
        .map(|(name, why)| {
            names.retain(|&n| n != name);
            let why = format!("{why}; --planner {name} runs it");
            eprintln!("note: {why}");
            json!({"name": name, "reason": why})
        })
        .collect()
}

/// Runs `allocview plan`.
pub fn run(args: &PlanArgs) -> Result<()> {
    let names = args.names()?;
    let opts = args.options()?;
    if let Some(out) = &args.out {
        // Before any work: the plan must never replace its own input.
        safe_write::refuse_if_same_file(&args.file, out)?;
    }
    let plan = load_plan(&args.file, &args.input, args.step)?;
    let pb = plan
        .to_buffers()
        .with_context(|| format!("while reading the buffers of {}", args.file.display()))?;
    let mut names = names;
    let skipped = if args.planner.is_empty() {
        leave_out_costly(&mut names, &pb.buffers)
    } else {
        Vec::new()
    };
    let lower_bound = max_live_bytes(&pb.buffers)
        .map_err(|e| anyhow::anyhow!("{}: {}", args.file.display(), describe(&e, &pb.ids)))?;
    let naive = run_planner("naive", &pb.buffers, &opts)
        .map_err(|e| anyhow::anyhow!("{}: {}", args.file.display(), describe(&e, &pb.ids)))?;
    let given = given_plan(&pb)?;
    let runs = run_planners(&pb, &names, &opts)?;

    let chosen = if args.planner.is_empty() {
        runs.iter()
            .reduce(|best, r| {
                if r.plan.total_bytes < best.plan.total_bytes {
                    r
                } else {
                    best
                }
            })
            .map(|r| r.name)
    } else {
        runs.first().map(|r| r.name)
    };
    let picture = args.picture.as_deref().map(parse_size).transpose()?;
    if let Some(out) = &args.out {
        let Some(run) = runs.iter().find(|r| Some(r.name) == chosen) else {
            bail!("no planner ran, so there is no plan to write");
        };
        write_plan(out, &args.file, &pb, &run.plan)?;
        eprintln!(
            "wrote {}'s plan ({} B) to {}",
            run.name,
            format::count(run.plan.total_bytes),
            out.display()
        );
    }

    if args.json {
        let planners: Vec<Value> = runs
            .iter()
            .map(|r| {
                let mut m = serde_json::Map::new();
                m.insert("name".into(), json!(r.name));
                m.insert("total_bytes".into(), json!(r.plan.total_bytes));
                m.insert(
                    "ratio_to_lower_bound".into(),
                    json!(ratio(r.plan.total_bytes, lower_bound)),
                );
                m.insert("seconds".into(), json!(r.seconds));
                if args.capacity.is_some() {
                    m.insert("fits".into(), json!(r.fits));
                }
                m.insert("proven_optimal".into(), json!(r.proven_optimal));
                Value::Object(m)
            })
            .collect();
        let mut obj = serde_json::Map::new();
        obj.insert("file".into(), json!(args.file.display().to_string()));
        obj.insert("format".into(), json!(plan.format.name()));
        obj.insert("time_unit".into(), json!(plan.time_unit));
        obj.insert("buffers".into(), json!(pb.buffers.len()));
        obj.insert("naive_bytes".into(), json!(naive.plan.total_bytes));
        obj.insert("lower_bound_bytes".into(), json!(lower_bound));
        if let Some(c) = args.capacity {
            obj.insert("capacity_bytes".into(), json!(c));
        }
        if let Some(g) = &given {
            obj.insert(
                "file_plan".into(),
                json!({
                    "total_bytes": g.total_bytes,
                    "fits": args.capacity.map(|c| g.total_bytes <= c),
                }),
            );
        }
        obj.insert("planners".into(), Value::Array(planners));
        if !skipped.is_empty() {
            obj.insert("skipped_planners".into(), Value::Array(skipped));
        }
        if args.out.is_some() {
            obj.insert("written".into(), json!(chosen));
        }
        obj.insert("load_seconds".into(), json!(plan.load_seconds));
        outln!("{}", Value::Object(obj));
    } else {
        print_table(
            args,
            &plan,
            &pb.buffers,
            naive.plan.total_bytes,
            lower_bound,
            given.as_ref(),
            &runs,
        )?;
    }
    if let (Some((w, h)), Some(run)) = (picture, runs.iter().find(|r| Some(r.name) == chosen)) {
        let grid = plan_view::rasterise(&pb.buffers, &run.plan, lower_bound, args.capacity, w, h);
        if args.json {
            // Keep stdout one JSON object.
            for line in picture_lines(&grid, run.name, plan.time_unit) {
                eprintln!("{line}");
            }
        } else {
            outln!();
            for line in picture_lines(&grid, run.name, plan.time_unit) {
                outln!("{line}");
            }
        }
    }
    Ok(())
}

/// `WxH` in characters.
fn parse_size(text: &str) -> Result<(usize, usize)> {
    let parsed = text
        .split_once(['x', 'X'])
        .and_then(|(w, h)| Some((w.trim().parse().ok()?, h.trim().parse().ok()?)));
    match parsed {
        Some((w, h)) if (8..=1000).contains(&w) && (2..=500).contains(&h) => Ok((w, h)),
        _ => bail!("--picture {text:?}: expected WIDTHxHEIGHT in characters, e.g. 100x24"),
    }
}

/// The plan picture as text: one letter per buffer (by index, cycling), `.` for empty space,
/// the address of the row's top at the left, and the lines marked at the right.
fn picture_lines(grid: &PlanGrid, planner: &str, time_unit: &str) -> Vec<String> {
    const GLYPHS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut lines = vec![format!(
        "{planner}'s plan: time across ({time_unit}s {}..{}), address up",
        grid.time_start, grid.time_end
    )];
    for row in 0..grid.height {
        let text: String = (0..grid.width)
            .map(|col| match grid.cell(col, row) {
                Some(PlanCell::Buffer { index, .. }) => GLYPHS
                    .get(index % GLYPHS.len())
                    .map_or('#', |&g| char::from(g)),
                _ => '.',
            })
            .collect();
        let mut marks = Vec::new();
        if row == grid.total_row {
            marks.push(format!("plan top {}", format::bytes(grid.total_bytes)));
        }
        if row == grid.lower_bound_row {
            marks.push(format!(
                "lower bound {}",
                format::bytes(grid.lower_bound_bytes)
            ));
        }
        if let (Some(r), Some(c)) = (grid.capacity_row, grid.capacity_bytes)
            && r == row
        {
            marks.push(format!("capacity {}", format::bytes(c)));
        }
        let (_, high) = grid.row_bytes(row);
        let label = if row == 0 || !marks.is_empty() || row + 1 == grid.height {
            format::bytes(high.round() as u64)
        } else {
            String::new()
        };
        let marks = if marks.is_empty() {
            String::new()
        } else {
            format!(" <- {}", marks.join(", "))
        };
        lines.push(format!("{label:>10} |{text}|{marks}"));
    }
    let (t_end, _) = grid.column_time(grid.width);
    lines.push(format!("{:>10} +{}+", "0 B", "-".repeat(grid.width)));
    lines.push(format!(
        "{:>10}  {:<w$}{}",
        "",
        grid.time_start,
        t_end.round() as u64,
        w = grid.width.saturating_sub(t_end.round().to_string().len())
    ));
    lines
}

/// Writes `plan` as minimalloc CSV with offsets (atomically, never over `input`).
fn write_plan(out: &Path, input: &Path, pb: &PlanBuffers, plan: &Plan) -> Result<()> {
    let mut text = Vec::new();
    minimalloc::write_minimalloc_csv(&mut text, &pb.ids, &pb.buffers, Some(&plan.offsets))?;
    Ok(safe_write::write_bytes(out, &text, &[input])?)
}

fn yes_no(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "yes",
        Some(false) => "no",
        None => "-",
    }
}

fn print_table(
    args: &PlanArgs,
    plan: &MemoryPlan,
    buffers: &[Buffer],
    naive_bytes: u64,
    lower_bound: u64,
    given: Option<&Plan>,
    runs: &[PlannerRun],
) -> Result<()> {
    use format::{bytes, count};
    let (t0, t1) = buffers
        .iter()
        .filter(|b| b.needs_memory())
        .fold((u64::MAX, 0), |(lo, hi), b| {
            (lo.min(b.lower), hi.max(b.upper))
        });
    let span = if t0 <= t1 {
        format!(", {}s {t0}..{t1}", plan.time_unit)
    } else {
        String::new()
    };
    outln!(
        "{}: {} ({} buffers{span})",
        args.file.display(),
        plan.format.name(),
        count(buffers.len() as u64)
    );
    // Exact bytes, and the binary-unit figure when it says more.
    let both = |n: u64| {
        if n < 1024 {
            format!("{n} B")
        } else {
            format!("{} B ({})", count(n), bytes(n))
        }
    };
    outln!(
        "naive {}, lower bound (max live) {}{}",
        both(naive_bytes),
        both(lower_bound),
        args.capacity
            .map_or(String::new(), |c| format!(", capacity {}", both(c)))
    );
    outln!();
    let with_fits = args.capacity.is_some();
    outln!(
        "  {:<18} {:>15} {:>10} {:>8} {:>10}{} {:>7}",
        "planner",
        "total bytes",
        "total",
        "/ bound",
        "time",
        if with_fits { "   fits" } else { "" },
        "proven"
    );
    let row = |name: &str, total: u64, time: String, fits: Option<bool>, optimal: &str| {
        format!(
            "  {:<18} {:>15} {:>10} {:>8.3} {:>10}{} {:>7}",
            name,
            count(total),
            bytes(total),
            ratio(total, lower_bound),
            time,
            if with_fits {
                format!(" {:>6}", yes_no(fits))
            } else {
                String::new()
            },
            optimal
        )
    };
    if let Some(g) = given {
        outln!(
            "{}",
            row(
                "(file's offsets)",
                g.total_bytes,
                "-".to_owned(),
                args.capacity.map(|c| g.total_bytes <= c),
                "-"
            )
        );
    }
    for r in runs {
        // "proven" optimal: by the search itself, or for any plan, by meeting the bound.
        let optimal = match r.proven_optimal {
            Some(p) => yes_no(Some(p)),
            None if r.plan.total_bytes == lower_bound => "yes",
            None => "-",
        };
        outln!(
            "{}",
            row(
                r.name,
                r.plan.total_bytes,
                format::seconds(r.seconds),
                r.fits,
                optimal
            )
        );
    }
    if let Some(search) = runs.iter().find(|r| r.name == "search") {
        let budget = args.time_budget.unwrap_or(DEFAULT_SEARCH_BUDGET_S);
        if args.capacity.is_some() && search.fits.is_none() {
            outln!(
                "\n  search did not decide within {budget} s whether a plan fits \
                 (--time-budget gives it more)"
            );
        } else if args.capacity.is_none() && search.proven_optimal == Some(false) {
            outln!(
                "\n  search did not prove its plan optimal within {budget} s, or the instance is \
                 too large to search exactly (--time-budget gives it more)"
            );
        }
    }
    Ok(())
}
