//! Colours of both frontends, in one place: no literal colours elsewhere.

/// An RGB colour, frontend-neutral.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rgb(pub u8, pub u8, pub u8);

/// Live bytes on the timeline.
pub const LIVE: Rgb = Rgb(0xe8, 0xe8, 0xe8);
/// Fragmentation on the timeline's second scale.
pub const FRAGMENTATION: Rgb = Rgb(0xd0, 0x70, 0xd0);
/// The cursor.
pub const CURSOR: Rgb = Rgb(0xff, 0xd7, 0x00);
/// OOM markers and rows.
pub const OOM: Rgb = Rgb(0xff, 0x40, 0x40);
/// Free space in a heap map.
pub const FREE: Rgb = Rgb(0x30, 0x34, 0x3c);
/// Dead (held, not reusable) space.
pub const DEAD: Rgb = Rgb(0x6a, 0x2a, 0x2a);
/// Internal waste (reserved beyond the request). A hue outside the size-class ramp (blue to
/// red), so waste never looks like a large live allocation.
pub const WASTE: Rgb = Rgb(0xa8, 0x48, 0xd8);
/// Dim text.
pub const DIM: Rgb = Rgb(0x80, 0x80, 0x80);
/// Blocks of the site selected in the sites panel, and its line on the timeline.
pub const SELECTED: Rgb = Rgb(0x00, 0xe0, 0xff);
/// Annotated phases (a PyTorch snapshot's `external_annotations`) on the timeline.
pub const PHASE: Rgb = Rgb(0x40, 0xb0, 0xa0);
/// A run's marks (`allocview ctl PID mark NAME`, where recording stopped and started).
pub const MARK: Rgb = Rgb(0xff, 0x9f, 0x1c);

/// One colour per policy, in registry order (index 1..); index 0 is live bytes.
/// The recorded program's own resident memory: a measurement, drawn apart from the models.
const RECORDED: Rgb = Rgb(0xe0, 0x4f, 0x4f);

const POLICY: [Rgb; 8] = [
    Rgb(0x4e, 0xa1, 0xff),
    Rgb(0x5c, 0xd6, 0x8a),
    Rgb(0xff, 0x8c, 0x42),
    Rgb(0xc3, 0x7b, 0xff),
    Rgb(0x3d, 0xd6, 0xd0),
    Rgb(0xff, 0x6b, 0x9a),
    Rgb(0xb8, 0xc2, 0x4a),
    Rgb(0x9a, 0x9a, 0xff),
];

/// Colour of timeline series `palette` (0 = live bytes, 1.. = policies).
#[must_use]
pub fn series(palette: usize) -> Rgb {
    if palette == 0 {
        LIVE
    } else if palette == usize::MAX - 1 {
        // The selected site's line (`view::SITE_PALETTE`).
        SELECTED
    } else if palette == usize::MAX - 2 {
        // The recorded program's resident memory (`view::RECORDED_PALETTE`).
        RECORDED
    } else {
        POLICY[(palette - 1) % POLICY.len()]
    }
}

/// Colour of live allocations of a size class: small classes blue, large classes red.
#[must_use]
pub fn class(class: u8) -> Rgb {
    // 1 B .. 1 GiB spans classes 1..31; clamp, then walk a blue -> green -> yellow -> red ramp.
    let t = (f64::from(class.clamp(1, 31)) - 1.0) / 30.0;
    let ramp = |a: f64, b: f64, x: f64| (a + (b - a) * x).round().clamp(0.0, 255.0) as u8;
    if t < 0.5 {
        let x = t * 2.0;
        Rgb(
            ramp(60.0, 80.0, x),
            ramp(120.0, 220.0, x),
            ramp(240.0, 90.0, x),
        )
    } else {
        let x = (t - 0.5) * 2.0;
        Rgb(
            ramp(80.0, 250.0, x),
            ramp(220.0, 70.0, x),
            ramp(90.0, 50.0, x),
        )
    }
}

/// Heatmap colour for an intensity in 0..1 (0 = nothing live).
#[must_use]
pub fn heat(v: f64) -> Rgb {
    if v <= 0.0 {
        return Rgb(0x18, 0x18, 0x1c);
    }
    let v = v.clamp(0.0, 1.0);
    let ramp = |a: f64, b: f64| (a + (b - a) * v).round().clamp(0.0, 255.0) as u8;
    Rgb(ramp(40.0, 255.0), ramp(30.0, 220.0), ramp(90.0, 60.0))
}

/// A darker shade of `c` (for telling neighbours apart).
#[must_use]
pub fn shade(c: Rgb) -> Rgb {
    let d = |v: u8| (f64::from(v) * 0.72).round() as u8;
    Rgb(d(c.0), d(c.1), d(c.2))
}

/// A colour per item of a picture where neighbours must differ (a plan's buffers): hues a
/// golden ratio apart, so consecutive items are far apart on the colour wheel.
#[must_use]
pub fn distinct(item: usize) -> Rgb {
    let hue = (item as f64 * 0.618_033_988_75).fract() * 6.0;
    let (s, v) = (0.55, 0.85);
    let f = hue.fract();
    let (p, q, t) = (v * (1.0 - s), v * (1.0 - s * f), v * (1.0 - s * (1.0 - f)));
    let (r, g, b) = match hue as u8 {
        0 => (v, t, p),
        1 => (q, v, p),
        2 => (p, v, t),
        3 => (p, q, v),
        4 => (t, p, v),
        _ => (v, p, q),
    };
    let byte = |x: f64| (x * 255.0).round().clamp(0.0, 255.0) as u8;
    Rgb(byte(r), byte(g), byte(b))
}
