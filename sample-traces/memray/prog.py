import threading

def make_table(n):
    rows = []
    for i in range(n):
        rows.append(bytearray(1000 + i))
    return rows

def worker(n, out):
    out.append(make_table(n))

def main():
    keep = make_table(200)
    out = []
    threads = [threading.Thread(target=worker, args=(300, out)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    big = bytearray(5_000_000)
    del big
    return keep, out

if __name__ == "__main__":
    main()
