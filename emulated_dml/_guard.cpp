// A DeviceGuardImplInterface for PrivateUse1, built on every torch where a compiler exists.
//
// torch 2.4 (what torch-directml 0.2.5 pins) has no Python-level device guard, and the
// autograd engine aborts in backward() with "PyTorch is not linked with support for
// privateuseone devices" unless a C++ guard is registered for the device type. torch >= 2.5
// has a Python one, but it reports one device whose index is always 0, so the autograd engine
// has no queue for privateuseone:1 (an INTERNAL ASSERT in backward() on adapter 1). The emulator
// keeps its data on the CPU, so there are no streams or events: this guard only tracks the
// current device index (per thread, like CUDA) and reports a device count.
//
// The count is read once, when the autograd engine starts its device threads (the first
// backward() of the process): it sizes the engine's per-device queues for good. So it is a
// capacity (at least kMinDevices), not the number of adapters registered at the time.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/extension.h>

#include <atomic>

namespace {

constexpr c10::DeviceIndex kMinDevices = 8;
std::atomic<c10::DeviceIndex> g_device_count{kMinDevices};
thread_local c10::DeviceIndex t_current_device = 0;

struct EmulatorGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  EmulatorGuardImpl() = default;
  explicit EmulatorGuardImpl(c10::DeviceType) {}

  c10::DeviceType type() const override {
    return c10::DeviceType::PrivateUse1;
  }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    t_current_device = d.index() < 0 ? 0 : d.index();
    return old;
  }
  c10::Device getDevice() const override {
    return c10::Device(c10::DeviceType::PrivateUse1, t_current_device);
  }
  void setDevice(c10::Device d) const override {
    t_current_device = d.index() < 0 ? 0 : d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    t_current_device = d.index() < 0 ? 0 : d.index();
  }
  c10::Stream getStream(c10::Device d) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getNewStream(c10::Device d, int) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return g_device_count.load();
  }
  // CPU work is synchronous: events are always complete.
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag)
      const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override {
    return true;
  }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, EmulatorGuardImpl);

void set_device_count(int64_t count) {
  auto n = static_cast<c10::DeviceIndex>(count);
  g_device_count.store(n > kMinDevices ? n : kMinDevices);
}

int64_t current_device() {
  return t_current_device;
}

void set_current_device(int64_t index) {
  t_current_device = static_cast<c10::DeviceIndex>(index);
}

// torch-directml's tensors are OpaqueTensorImpls: storage access throws. The emulator's wrapper
// tensors get the same refusal (and lose their placeholder storage): what
// torch._C._set_storage_access_error_msg does on torch >= 2.5 builds, which torch 2.4's CPU
// build lacks.
void refuse_storage(const at::Tensor& t, const std::string& message) {
  t.unsafeGetTensorImpl()->release_storage_and_set_meta_custom_data_ptr_error_msg_(message);
}

// Sizes, strides and offset of a wrapper tensor whose storage access throws (set_() would read
// its storage): after an in-place resize of its CPU payload.
void set_metadata(const at::Tensor& t, const std::vector<int64_t>& sizes,
                  const std::vector<int64_t>& strides, int64_t offset) {
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
}

// Gap "readback-gil": torch-directml 0.2.5 deadlocks when one number is read back with the GIL
// held (torch's argument parser reads a device tensor given as a size or a number,
// torch.zeros(b, counts.max(), n), with item() and the GIL held). Its read back waits on a fence
// that its event thread signals after running the completions queued before it, and a
// completion that drops the last reference to a tensor Python has let go of takes the GIL to
// free its Python object. Whether a completion needs the GIL then depends on timing; the
// emulator raises on every such read back instead, so a test meets it every time. Tensor.item(),
// float(t), Tensor.to and every op called from Python release the GIL first and pass.
//
// The check stands where the wheel's own kernel would be entered: below autograd (at
// ADInplaceOrView, the last key before the emulator's Python dispatch, which would take the GIL
// itself), so it judges every read back that reaches the device, a kernel dmlshim registers above
// autograd for the op (its guard readback_gil) included: a guard that read back holding the GIL
// fails here. ADInplaceOrView is no backend's key: other devices' tensors pass straight through.
std::atomic<bool> g_readback_gil{false};

c10::Scalar local_scalar_dense_gil_check(c10::DispatchKeySet keys, const at::Tensor& self) {
  TORCH_CHECK(!(g_readback_gil.load() && self.device().type() == c10::DeviceType::PrivateUse1 &&
                PyGILState_Check()),
              "emulated_dml (gap readback-gil): a device tensor was read back as one number with "
              "the GIL held (a device tensor given as a size or a number, e.g. torch.zeros(n, "
              "t.max())); torch-directml 0.2.5 can deadlock there");
  return at::_ops::_local_scalar_dense::redispatch(keys & c10::after_ADInplaceOrView_keyset, self);
}

TORCH_LIBRARY_IMPL(aten, ADInplaceOrView, m) {
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense_gil_check));
}

void set_readback_gil(bool on) {
  g_readback_gil.store(on);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("set_device_count", &set_device_count, "adapters to cover (at least 8)");
  m.def("current_device", &current_device, "current adapter index of this thread");
  m.def("set_current_device", &set_current_device, "set this thread's current adapter");
  m.def("refuse_storage", &refuse_storage, "make storage access of a tensor throw");
  m.def("set_metadata", &set_metadata, "set sizes, strides and storage offset of a tensor");
  m.def("set_readback_gil", &set_readback_gil, "gap readback-gil on or off");
}
