// autokernel from C++: a small RAII wrapper over the C ABI (handles freed by unique_ptr,
// status codes turned into exceptions), then a linear layer y = gelu(x·W + b) with the
// weight packed once and used for several batch sizes, checked against a naive loop.
/*
 *   cargo build -p autokernel_capi
 *   c++ -std=c++17 -O2 -I capi/include capi/examples/linear.cpp -o linear \
 *       -L target/debug -lautokernel -Wl,-rpath,$PWD/target/debug
 *   ./linear [tuning.db]
 */
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "autokernel.h"
#include "reference.h"

namespace autokernel {

// The error of a failed call: its status code and the thread's message.
struct Error : std::runtime_error {
    int status;
    explicit Error(int st)
        : std::runtime_error(std::string(autokernel_status_name(st)) + ": " + autokernel_last_error()),
          status(st) {}
};

inline void check(int st) {
    if (st != AUTOKERNEL_OK) throw Error(st);
}

class Weight;

// A runtime on a tuning database (nullptr: kernel defaults only), freed with the object.
class Runtime {
  public:
    explicit Runtime(const char* db, unsigned threads = 0) {
        AutokernelRuntime* rt = nullptr;
        check(autokernel_runtime_open(db, threads, nullptr, &rt));
        rt_.reset(rt);
    }

    // Which variant serves a workload, as JSON.
    std::string lookup(const std::string& workload) const {
        char* json = nullptr;
        check(autokernel_runtime_lookup(rt_.get(), workload.c_str(), &json));
        std::string out(json);
        autokernel_string_free(json);
        return out;
    }

    // y = act(x·W + bias) for x of m rows; returns the AUTOKERNEL_LEVEL_* that served it.
    int linear(const Weight& w, size_t m, const std::vector<float>& x, const std::vector<float>& bias,
               std::vector<float>& y) const;

    const AutokernelRuntime* get() const { return rt_.get(); }

  private:
    struct Free {
        void operator()(AutokernelRuntime* rt) const { autokernel_runtime_free(rt); }
    };
    std::unique_ptr<AutokernelRuntime, Free> rt_;
};

// A k×n weight packed once for the row counts in `ms` (others work too).
class Weight {
  public:
    Weight(const Runtime& rt, size_t n, size_t k, int act, const std::vector<float>& w,
           const std::vector<size_t>& ms) {
        AutokernelWeight* p = nullptr;
        check(autokernel_weight_pack(rt.get(), n, k, act, w.data(), w.size(), ms.data(), ms.size(), &p));
        w_.reset(p);
    }
    const AutokernelWeight* get() const { return w_.get(); }

    // What serves its first M and what it holds, as JSON.
    std::string info() const {
        char* json = nullptr;
        check(autokernel_weight_info(w_.get(), &json));
        std::string out(json);
        autokernel_string_free(json);
        return out;
    }

  private:
    struct Free {
        void operator()(AutokernelWeight* w) const { autokernel_weight_free(w); }
    };
    std::unique_ptr<AutokernelWeight, Free> w_;
};

inline int Runtime::linear(const Weight& w, size_t m, const std::vector<float>& x,
                           const std::vector<float>& bias, std::vector<float>& y) const {
    int level = -1;
    check(autokernel_runtime_linear(rt_.get(), w.get(), m, x.data(), x.size(), bias.data(), bias.size(),
                                    y.data(), y.size(), &level));
    return level;
}

}  // namespace autokernel

int main(int argc, char** argv) {
    try {
        autokernel::Runtime rt(argc > 1 ? argv[1] : nullptr);
        const size_t n = 96, k = 72;
        unsigned long long seed = 7;
        std::vector<float> w(k * n), bias(n);
        ref_fill(w.data(), w.size(), &seed);
        ref_fill(bias.data(), bias.size(), &seed);
        autokernel::Weight packed(rt, n, k, AUTOKERNEL_ACT_GELU, w, {1, 16});

        for (size_t m : {1, 16, 5, 40}) {
            std::vector<float> x(m * k), y(m * n);
            ref_fill(x.data(), x.size(), &seed);
            int level = rt.linear(packed, m, x, bias, y);
            std::vector<double> want(m * n), tol(m * n);
            ref_linear(m, n, k, AUTOKERNEL_ACT_GELU, x.data(), w.data(), bias.data(), want.data(), tol.data());
            if (ref_check("linear", y.data(), want.data(), tol.data(), y.size())) return 1;
            std::printf("linear m=%zu n=%zu k=%zu gelu ok (level %d)\n", m, n, k, level);
        }
        std::printf("lookup: %s\n", rt.lookup("gemm_bias_gelu:16x96x72").c_str());
        std::printf("weight: %s\n", packed.info().c_str());

        try {
            std::vector<float> x(3 * k + 1), y(3 * n);
            rt.linear(packed, 3, x, bias, y);
            return 1;  // a shape error must throw
        } catch (const autokernel::Error& e) {
            std::printf("caught: %s\n", e.what());
            if (e.status != AUTOKERNEL_SHAPE) return 1;
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
