//! A bump arena that reports its blocks to allocview: `allocview record -- bump_arena`, then
//! `allocview stats trace.avt --heap rust-arena`. It allocates 500 blocks of 1000 + i bytes
//! and gives back every other one (i even); the test `app/tests/record_heaps.rs` checks the
//! trace against these figures.

use allocview_heap::Heap;

fn main() {
    let heap = Heap::new("rust-arena");
    let mut arena = vec![0u8; 1 << 20];
    let mut used = 0usize;
    let mut blocks = Vec::new();
    for i in 0..500usize {
        let size = 1000 + i;
        let at = used.next_multiple_of(16);
        used = at + size;
        let block = arena.get(at..used).unwrap_or_default();
        heap.alloc(block.as_ptr(), size);
        blocks.push(block.as_ptr());
    }
    for block in blocks.iter().step_by(2) {
        heap.free(*block);
    }
    arena.fill(1);
    println!(
        "blocks={} reporting={}",
        blocks.len(),
        u8::from(allocview_heap::tracer_loaded())
    );
}
