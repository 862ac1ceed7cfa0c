import threading
def leaf(n):
    return [bytearray(64 * i) for i in range(n)]
def work():
    keep = leaf(20)
    return keep
t = threading.Thread(target=work, name="helper"); t.start(); t.join()
data = leaf(30)
big = bytearray(300_000); del big
