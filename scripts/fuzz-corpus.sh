#!/usr/bin/env bash
# Builds the fuzz targets' seed corpora in fuzz/corpus/<target>/ from the real files: the
# repo's sample traces and test data, ../shared/data when present, and fuzz/seeds/ (spools
# and stack tables recorded for the purpose). Large files are cut to a head, so the fuzzer
# mutates inputs of tens of KiB rather than megabytes. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
shared="$root/../shared/data"
corpus="$root/fuzz/corpus"
mkdir -p "$corpus"
seed() { mkdir -p "$corpus/$1"; }

# Text traces: the first 1,500 lines of each gzip trace, plain; gzip of the same heads.
seed malloc_text; seed malloc_gzip
for f in "$root"/sample-traces/*.trace.gz "$root"/loaders/tests/data/*.trace.gz "$shared"/traces/*.trace.gz; do
    [ -f "$f" ] || continue
    name="$(basename "$f" .trace.gz)"
    (gzip -dc "$f" || true) | head -n 1500 > "$corpus/malloc_text/$name.txt"
    gzip -c "$corpus/malloc_text/$name.txt" > "$corpus/malloc_gzip/$name.gz"
done
cp "$root/sample-traces/xz_T2_8KiB_blocks.trace.gz" "$corpus/malloc_gzip/xz_whole.gz"

# Binary traces: the frames after the 10-byte header (the target writes the header).
seed binary
for f in "$root"/sample-traces/*.avt; do
    tail -c +11 "$f" > "$corpus/binary/$(basename "$f" .avt).bin"
done

# TensorFlow: dumps and memory logs whole (the public ones) and cut (the large ones).
seed tf_dump; seed tf_memlog
for f in "$root"/loaders/tests/data/tf/*.txt; do
    cp "$f" "$corpus/tf_dump/"; cp "$f" "$corpus/tf_memlog/"
done
for f in "$root"/loaders/tests/data/tf/*.txt.gz; do
    name="$(basename "$f" .txt.gz)"
    (gzip -dc "$f" || true) | head -n 400 > "$corpus/tf_memlog/$name.head.txt"
    # The dump is at the end of a log: its last 600 lines.
    (gzip -dc "$f" || true) | tail -n 600 > "$corpus/tf_dump/$name.tail.txt"
done

# Plans.
seed minimalloc_csv; seed graph_json
cp "$root"/loaders/tests/data/plans/minimalloc/*.csv "$root"/sample-traces/plans/*.csv "$corpus/minimalloc_csv/"
cp "$root"/loaders/tests/data/plans/*.json "$corpus/graph_json/"
for f in "$root"/app/tests/data/*.json; do [ -f "$f" ] && cp "$f" "$corpus/graph_json/"; done

# PyTorch profiler traces: the test traces, decompressed (the target reads plain JSON as well).
seed kineto
for f in "$root"/loaders/tests/data/kineto/*.gz; do
    (gzip -dc "$f" || true) > "$corpus/kineto/$(basename "$f" .gz)"
done

# PyTorch snapshots: the fixtures whole, the smallest real snapshot whole.
seed pickle
cp "$root"/loaders/tests/data/pytorch/*.pickle "$corpus/pickle/"
cp "$root/sample-traces/pytorch/lm_train_step_windows.pickle" "$corpus/pickle/"

# heaptrack data files: the test data's whole (compressed as heaptrack wrote them) and a
# plain head of each (the raw stream too: the loader must refuse it clearly).
seed heaptrack
for f in "$root"/loaders/tests/data/heaptrack/heaptrack.* "$shared"/interop/heaptrack/heaptrack.*; do
    [ -f "$f" ] || continue
    name="$(basename "$f")"
    [ "$(stat -c %s "$f")" -le 65536 ] && cp "$f" "$corpus/heaptrack/$name"
    (zstd -dcq "$f" 2>/dev/null || gzip -dc "$f" 2>/dev/null || cat "$f") | head -n 1500 \
        > "$corpus/heaptrack/$name.head.txt" || true
done

# Heap profiles: the test data's pprof and DHAT files whole, and the shared ones up to 64 KiB.
seed profile
for f in "$root"/loaders/tests/data/profiles/*.prof "$root"/loaders/tests/data/profiles/*.gz \
         "$root"/loaders/tests/data/profiles/*.json "$root"/loaders/tests/data/profiles/*.out \
         "$shared"/interop/pprof/* "$shared"/interop/dhat/*; do
    [ -f "$f" ] && [ "$(stat -c %s "$f")" -le 65536 ] && cp "$f" "$corpus/profile/"
done

# memray captures: the small ones whole (LZ4 frames; the committed seeds hold decompressed
# streams, which the loader reads as `--no-compress` captures).
seed memray
for f in "$root"/sample-traces/memray/threads1*.bin "$root"/loaders/tests/data/memray/*.bin; do
    [ -f "$f" ] && cp "$f" "$corpus/memray/"
done

# The committed seeds (recorded spools and stack tables, and the small entries of earlier
# campaigns' corpora) and the regression inputs found so far seed their targets too.
for d in "$root"/fuzz/seeds/*/; do
    [ -d "$d" ] || continue
    t="$(basename "$d")"; seed "$t"; cp "$d"* "$corpus/$t/" 2>/dev/null || true
done
for d in "$root"/fuzz/regressions/*/; do
    [ -d "$d" ] || continue
    t="$(basename "$d")"; seed "$t"; cp "$d"* "$corpus/$t/" 2>/dev/null || true
done
du -sh "$corpus"/* | sed "s|$corpus/||"
