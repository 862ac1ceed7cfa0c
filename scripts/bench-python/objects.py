"""Benchmark workload (b): object-heavy, single-threaded (dicts, tuples, lists, strings)."""


class Node:
    __slots__ = ("key", "value", "children")

    def __init__(self, key, value):
        self.key = key
        self.value = value
        self.children = []


def build(n):
    nodes = {}
    for i in range(n):
        node = Node(i, (i, str(i), [i] * 3))
        nodes[i] = node
        if i:
            nodes[i // 2].children.append(node)
    return nodes


for _ in range(3):
    tree = build(150_000)
    del tree
