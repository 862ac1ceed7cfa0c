// Allocation-heavy C++ for scripts/bench-stacks.sh: std::map, std::string and std::vector
// built and torn down by functions a few calls deep, in one thread or several. Built -O2
// (no frame pointers), so stacks need the DWARF unwind tables.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

__attribute__((noinline)) static std::string make_name(int i) {
    return "item-" + std::to_string(i) + std::string(i % 40, 'x');
}

__attribute__((noinline)) static size_t fill_map(int n, int seed) {
    std::map<int, std::string> m;
    for (int i = 0; i < n; i++) m[(i * 7919 + seed) % (n * 2)] = make_name(i);
    return m.size();
}

__attribute__((noinline)) static size_t grow_vectors(int n) {
    std::vector<std::vector<int>> vs;
    for (int i = 0; i < n; i++) {
        vs.emplace_back(i % 64 + 1, i);
        if (vs.size() > 256) vs.clear();
    }
    return vs.size();
}

__attribute__((noinline)) static size_t round_of_work(int rounds, int seed) {
    size_t total = 0;
    for (int r = 0; r < rounds; r++) total += fill_map(2000, seed + r) + grow_vectors(2000);
    return total;
}

int main(int argc, char** argv) {
    int rounds = argc > 1 ? std::atoi(argv[1]) : 200;
    int threads = argc > 2 ? std::atoi(argv[2]) : 1;
    std::vector<std::thread> ts;
    std::vector<size_t> out(threads);
    for (int t = 0; t < threads; t++)
        ts.emplace_back([&, t] { out[t] = round_of_work(rounds / threads, t); });
    for (auto& t : ts) t.join();
    size_t sum = 0;
    for (size_t v : out) sum += v;
    std::printf("%zu\n", sum);
    return 0;
}
