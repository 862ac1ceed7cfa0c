"""A program whose functions hold known bytes at its peak: a dict of tuples (small objects,
pymalloc's), 5 KB `bytes` objects (the C library's) and cached strings. The book's "Python
programs" page records it: `allocview record -o r.avt -- python3 three_holders.py`."""


def build_table(n):
    return {i: (i, i * 2, str(i)) for i in range(n)}


def make_blobs(n):
    return [bytes(5000) + bytes([i % 256]) for i in range(n)]


def grow_cache(n):
    cache = {}
    for i in range(n):
        cache[i] = "k" * 40 + str(i)
    return cache


def main():
    table = build_table(150_000)
    blobs = make_blobs(5_000)
    cache = grow_cache(60_000)
    return len(table) + len(blobs) + len(cache)


if __name__ == "__main__":
    main()
