// The translation unit that carries the precompiled LibTorch headers of the tests and benchmarks
// (pipeline_torch_pch in CMakeLists.txt). Intentionally empty.
