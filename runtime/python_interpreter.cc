// The Python plugin (runtime/python_plugin.h): an embedded CPython that runs
// Python eager programs, and imports the modules that define operators
// compiled code calls (whose calls then run here, taking the GIL).
//
// The interpreter starts once per process from the Python environment the
// server names, the one the programs were captured in, so that the
// interpreter, its standard library and torch's Python half agree. Its module
// precompile_eager is built in (capture/precompile_eager.py, the classes the
// saved programs are made of), installed before any program loads.
//
// Tensors cross as DLPack capsules: they share memory with the caller's, and
// this file needs neither libtorch_python nor its headers.
//
// The GIL: taken for the Python parts of a call only. torch's operators
// release it while they compute, and so does precompile::call_frame, so
// variants of the frames a program calls run beside other programs.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
// Python.h first, as it asks.

#include <ATen/DLConvertor.h>
#include <ATen/core/ivalue.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/python_plugin.h"

extern const char kPrecompileEagerSource[];

namespace precompile {
namespace {

// A strong reference, released on scope exit (with the GIL held).
class Ref {
 public:
  explicit Ref(PyObject* object = nullptr) : object_(object) {}
  ~Ref() { Py_XDECREF(object_); }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  PyObject* get() const { return object_; }
  PyObject* release() {
    PyObject* o = object_;
    object_ = nullptr;
    return o;
  }
  explicit operator bool() const { return object_ != nullptr; }

 private:
  PyObject* object_;
};

// The pending Python exception as "Type: message" and its traceback; clears it.
void TakeException(PythonError* error) {
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  Ref type_ref(type), value_ref(value), traceback_ref(traceback);
  if (type == nullptr) {
    error->message = "the Python call failed without an exception";
    return;
  }
  std::string name = reinterpret_cast<PyTypeObject*>(type)->tp_name;
  std::string text;
  if (value != nullptr) {
    Ref str(PyObject_Str(value));
    const char* utf8 = str ? PyUnicode_AsUTF8(str.get()) : nullptr;
    if (utf8 != nullptr) text = utf8;
  }
  error->message = text.empty() ? name : name + ": " + text;
  Ref module(PyImport_ImportModule("traceback"));
  Ref format(module ? PyObject_GetAttrString(module.get(), "format_exception") : nullptr);
  Ref lines(format && value != nullptr
                ? PyObject_CallFunctionObjArgs(format.get(), type, value,
                                               traceback != nullptr ? traceback : Py_None, nullptr)
                : nullptr);
  if (lines && PyList_Check(lines.get())) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lines.get()); ++i) {
      const char* line = PyUnicode_AsUTF8(PyList_GET_ITEM(lines.get(), i));
      if (line != nullptr) error->traceback += line;
    }
  }
  PyErr_Clear();  // Whatever formatting the traceback raised.
}

// What programs print (print(), logging's last-resort handler, warnings,
// tracebacks) goes to std::cerr instead of the process's file descriptors:
// the server passes std::cerr's lines at a bounded rate (see
// base/rate_limited_lines.h), and a model that prints on every call would
// otherwise write as fast as clients call it. Lines also stay whole among
// the server's own, where Python would buffer stdout until exit.
PyObject* WriteToCerr(PyObject* /*module*/, PyObject* text) {
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(text, &size);
  if (utf8 == nullptr) return nullptr;
  std::cerr.write(utf8, size);
  return PyLong_FromSsize_t(PyUnicode_GetLength(text));
}

PyMethodDef kWriteToCerr = {"write_to_cerr", WriteToCerr, METH_O, nullptr};

constexpr char kServerStreams[] = R"(
import io
import sys

class ServerLog(io.TextIOBase):
    def __init__(self, write):
        self._write = write

    @property
    def encoding(self):
        return "utf-8"

    def writable(self):
        return True

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        return self._write(text)

sys.stdout = sys.stderr = ServerLog(write_to_cerr)
)";

// The GIL is held.
bool SendStreamsToCerr(PythonError* error) {
  Ref globals(PyDict_New());
  Ref write(PyCFunction_New(&kWriteToCerr, nullptr));
  if (!globals || !write ||
      PyDict_SetItemString(globals.get(), "__builtins__", PyEval_GetBuiltins()) != 0 ||
      PyDict_SetItemString(globals.get(), "write_to_cerr", write.get()) != 0) {
    TakeException(error);
    return false;
  }
  Ref done(PyRun_String(kServerStreams, Py_file_input, globals.get(), globals.get()));
  if (!done) {
    TakeException(error);
    error->message = "cannot send the Python interpreter's output to the server's log: " +
                     error->message;
    return false;
  }
  return true;
}

// What the plugin keeps of precompile_eager once started.
struct Interpreter {
  std::string environment;
  std::vector<std::string> path;
  PyObject* load = nullptr;
  PyObject* run = nullptr;
  PyObject* check_environment = nullptr;
  PyObject* stopped = nullptr;  // precompile_eager.Stopped
};

std::mutex start_mutex;
Interpreter* interpreter = nullptr;  // Set once, never freed: Python is never finalized.
std::string start_failure;           // Why the one start failed.

// Installs precompile_eager and keeps its entry points. The GIL is held.
bool SetUp(const std::string& environment, PythonError* error) {
  auto fail = [&]() {
    TakeException(error);
    error->message = "cannot set up the Python interpreter of " + environment + ": " + error->message;
    return false;
  };
  Ref code(Py_CompileString(kPrecompileEagerSource, "precompile_eager.py", Py_file_input));
  if (!code) return fail();
  Ref module(PyImport_ExecCodeModule("precompile_eager", code.get()));
  if (!module) return fail();
  auto* started = new Interpreter;
  started->environment = environment;
  started->load = PyObject_GetAttrString(module.get(), "load");
  started->run = PyObject_GetAttrString(module.get(), "run");
  started->check_environment = PyObject_GetAttrString(module.get(), "check_environment");
  started->stopped = PyObject_GetAttrString(module.get(), "Stopped");
  if (started->load == nullptr || started->run == nullptr ||
      started->check_environment == nullptr || started->stopped == nullptr) {
    delete started;
    return fail();
  }
  interpreter = started;
  return true;
}

// Puts `path` first on sys.path, in order. The GIL is held.
bool PrependToSysPath(const std::vector<std::string>& path, PythonError* error) {
  PyObject* sys_path = PySys_GetObject("path");  // Borrowed.
  if (sys_path == nullptr || !PyList_Check(sys_path)) {
    error->message = "the Python interpreter has no sys.path list";
    return false;
  }
  for (size_t i = 0; i < path.size(); ++i) {
    Ref entry(PyUnicode_DecodeFSDefault(path[i].c_str()));
    if (!entry || PyList_Insert(sys_path, static_cast<Py_ssize_t>(i), entry.get()) != 0) {
      TakeException(error);
      return false;
    }
  }
  return true;
}

// The Python version a virtual environment was made from, as its
// pyvenv.cfg says ("version = 3.11.7", or uv's "version_info = 3.11.7");
// empty for an installation that is not a virtual environment.
std::string VenvVersion(const std::string& environment) {
  std::ifstream config(environment + "/pyvenv.cfg");
  std::string line;
  while (std::getline(config, line)) {
    const size_t equals = line.find('=');
    if (equals == std::string::npos) continue;
    std::string key = line.substr(0, equals);
    key.erase(key.find_last_not_of(" \t") + 1);
    if (key != "version" && key != "version_info") continue;
    std::string value = line.substr(equals + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    // "3.11.7.final.0" -> "3.11.7"
    size_t dots = 0, end = 0;
    while (end < value.size() && (std::isdigit(static_cast<unsigned char>(value[end])) ||
                                  (value[end] == '.' && ++dots < 3))) {
      ++end;
    }
    return value.substr(0, end);
  }
  return "";
}

bool StartLocked(const std::string& environment, const std::vector<std::string>& path,
                 PythonError* error) {
  const std::string executable = environment + "/bin/python3";
  if (access(executable.c_str(), X_OK) != 0) {
    error->message = "no Python interpreter at " + executable +
                     " (the Python environment is named by --python_env)";
    return false;
  }
  // An environment made from another Python build has another standard
  // library and extension modules, which fail in this interpreter in ways
  // that name neither ("No module named '_csv'").
  if (const std::string made_from = VenvVersion(environment);
      !made_from.empty() && made_from != PY_VERSION) {
    error->message = "the Python environment " + environment + " was made from Python " +
                     made_from +
                     " (its pyvenv.cfg), and this server embeds Python " PY_VERSION
                     ": name an environment made from Python " PY_VERSION " (--python_env)";
    return false;
  }
  // The plugin is loaded with RTLD_LOCAL, and so is libpython with it; the
  // interpreter's extension modules resolve its symbols globally.
  Dl_info python{};
  if (dladdr(reinterpret_cast<void*>(&Py_InitializeFromConfig), &python) == 0 ||
      dlopen(python.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD) == nullptr) {
    error->message = "cannot make libpython's symbols global for Python's extension modules";
    return false;
  }
  // Isolated, as `python3 -I`: what the interpreter imports comes from the
  // environment the operator named and the directories of --python_path,
  // never from the server's environment variables (PYTHONPATH, PYTHONHOME,
  // PYTHONSTARTUP...), the user's site-packages or the working directory.
  PyConfig config;
  PyConfig_InitIsolatedConfig(&config);
  // The server owns its signals (SIGTERM drains it) and its command line.
  config.install_signal_handlers = 0;
  config.parse_argv = 0;
  PyStatus status = PyConfig_SetBytesString(&config, &config.executable, executable.c_str());
  if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(status)) {
    error->message = std::string("cannot start the Python interpreter of ") + environment + ": " +
                     (status.err_msg != nullptr ? status.err_msg : "unknown error");
    return false;
  }
  // The GIL is held from here; SetUp's references are gone before it is let go.
  const bool set_up =
      SendStreamsToCerr(error) && PrependToSysPath(path, error) && SetUp(environment, error);
  if (set_up) interpreter->path = path;
  PyEval_SaveThread();
  return set_up;
}

bool Start(const std::string& environment, const std::vector<std::string>& path,
           PythonError* error) {
  std::lock_guard<std::mutex> lock(start_mutex);
  if (interpreter != nullptr) {
    if (interpreter->environment == environment && interpreter->path == path) return true;
    error->message = "this process runs the Python environment " + interpreter->environment +
                     " with its own path, not " + environment + ": one process runs one";
    return false;
  }
  // Python cannot be started twice in a process: a failed start is final.
  if (!start_failure.empty()) {
    error->message = start_failure;
    return false;
  }
  if (!StartLocked(environment, path, error)) {
    start_failure = error->message;
    return false;
  }
  return true;
}

class Gil {
 public:
  Gil() : state_(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(state_); }
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;

 private:
  PyGILState_STATE state_;
};

bool CheckEnvironment(const std::string& python_version,
                      const std::vector<std::pair<std::string, std::string>>& modules,
                      PythonError* error) {
  Gil gil;
  Ref list(PyList_New(0));
  for (const auto& [name, version] : modules) {
    Ref pair(Py_BuildValue("(ss)", name.c_str(), version.c_str()));
    if (!pair || PyList_Append(list.get(), pair.get()) != 0) {
      TakeException(error);
      return false;
    }
  }
  Ref why(PyObject_CallFunction(interpreter->check_environment, "sO", python_version.c_str(),
                                list.get()));
  if (!why) {
    TakeException(error);
    return false;
  }
  if (why.get() == Py_None) return true;
  const char* text = PyUnicode_AsUTF8(why.get());
  error->message = text != nullptr ? text : "the Python environment cannot run the artifact";
  PyErr_Clear();
  return false;
}

void* Load(const std::string& frame, const std::string& path, const std::string& device,
           PythonError* error) {
  Gil gil;
  Ref program(PyObject_CallFunction(interpreter->load, "ss", path.c_str(), device.c_str()));
  if (!program) {
    TakeException(error);
    return nullptr;
  }
  return program.release();
}

bool ImportModule(const std::string& module, PythonError* error) {
  Gil gil;
  Ref imported(PyImport_ImportModule(module.c_str()));
  if (!imported) {
    TakeException(error);
    return false;
  }
  return true;
}

void DeleteCapsule(PyObject* capsule) {
  // Only a capsule nobody consumed still owns its tensor.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (managed->deleter != nullptr) managed->deleter(managed);
  }
}

// `value` as a Python object (a tensor as a DLPack capsule); nullptr with a
// Python exception set for a type a frame cannot take.
PyObject* ToPython(const c10::IValue& value) {
  if (value.isTensor()) {
    DLManagedTensor* managed = at::toDLPack(value.toTensor());
    PyObject* capsule = PyCapsule_New(managed, "dltensor", DeleteCapsule);
    if (capsule == nullptr) managed->deleter(managed);
    return capsule;
  }
  if (value.isNone()) Py_RETURN_NONE;
  if (value.isBool()) return PyBool_FromLong(value.toBool());
  if (value.isInt()) return PyLong_FromLongLong(value.toInt());
  if (value.isDouble()) return PyFloat_FromDouble(value.toDouble());
  if (value.isString()) {
    const std::string& s = value.toStringRef();
    return PyUnicode_FromStringAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
  }
  PyErr_Format(PyExc_TypeError, "an argument of type %s cannot be passed to Python",
               value.tagKind().c_str());
  return nullptr;
}

// A leaf of a program's result as an IValue; false (with `error` set) for a
// type the runtime cannot return.
bool FromPython(PyObject* leaf, c10::IValue* out, PythonError* error) {
  if (PyCapsule_CheckExact(leaf)) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(leaf, "dltensor"));
    if (managed == nullptr) {
      TakeException(error);
      return false;
    }
    PyCapsule_SetName(leaf, "used_dltensor");
    // A copy, made here with the GIL held: the tensor Python made keeps its
    // Python object alive (PyTorch hands the object to the tensor once the
    // program's frames are gone), and whichever thread freed the last
    // reference to it would wait for the GIL. The request's thread, holding
    // a run slot, would then wait for the next miss's Python on a niced
    // eager thread (bench/RESULTS.md, section 6g). The original goes with
    // the capsule, on this thread.
    *out = at::fromDLPack(managed).clone();
    return true;
  }
  if (leaf == Py_None) {
    *out = c10::IValue();
  } else if (PyBool_Check(leaf)) {
    *out = c10::IValue(leaf == Py_True);
  } else if (PyLong_Check(leaf)) {
    const long long v = PyLong_AsLongLong(leaf);
    if (v == -1 && PyErr_Occurred()) {
      TakeException(error);
      return false;
    }
    *out = c10::IValue(static_cast<int64_t>(v));
  } else if (PyFloat_Check(leaf)) {
    *out = c10::IValue(PyFloat_AsDouble(leaf));
  } else if (PyUnicode_Check(leaf)) {
    Py_ssize_t size = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(leaf, &size);
    if (utf8 == nullptr) {
      TakeException(error);
      return false;
    }
    *out = c10::IValue(std::string(utf8, static_cast<size_t>(size)));
  } else {
    error->message = std::string("it returned a ") + Py_TYPE(leaf)->tp_name +
                     " among the leaves of its result, which is not a tensor, None, bool, int, "
                     "float or str";
    return false;
  }
  return true;
}

// Ends programs whose calls should stop. A running program registers its
// thread and its stop predicate; one thread polls the predicates and raises
// precompile_eager.Stopped in the threads of those that say stop, with the
// GIL held: a program's thread unregisters (and clears an exception not yet
// raised) with the GIL held too, so the exception never reaches the next
// program that thread runs.
class StopWatcher {
 public:
  struct Running {
    unsigned long thread;  // PyThread_get_thread_ident()
    bool (*stop)(const void*);
    const void* context;
    bool stopped = false;
  };

  // The GIL is held.
  void Add(Running* running) {
    std::lock_guard<std::mutex> lock(mu_);
    running_.push_back(running);
    if (!watching_) {
      watching_ = true;
      std::thread([this] { Watch(); }).detach();  // Lives as long as Python.
    }
    changed_.notify_one();
  }
  // The GIL is held.
  void Remove(Running* running) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_.erase(std::find(running_.begin(), running_.end(), running));
    }
    if (running->stopped) PyThreadState_SetAsyncExc(running->thread, nullptr);
  }

 private:
  void Watch() {
    constexpr auto kPoll = std::chrono::milliseconds(50);
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        changed_.wait(lock, [this] { return !running_.empty(); });
      }
      std::this_thread::sleep_for(kPoll);
      Gil gil;
      std::lock_guard<std::mutex> lock(mu_);
      for (Running* running : running_) {
        if (running->stopped || !running->stop(running->context)) continue;
        running->stopped = true;
        PyThreadState_SetAsyncExc(running->thread, interpreter->stopped);
      }
    }
  }

  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<Running*> running_;
  bool watching_ = false;
};

StopWatcher* stop_watcher = new StopWatcher;  // Never freed, like Python.

bool Run(void* program, std::vector<c10::IValue>& args, std::vector<c10::IValue>* leaves,
         bool (*stop)(const void*), const void* stop_context, PythonError* error) {
  Gil gil;
  StopWatcher::Running running{PyThread_get_thread_ident(), stop, stop_context};
  struct Watched {
    explicit Watched(StopWatcher::Running* r) : running(r) {
      if (running->stop != nullptr) stop_watcher->Add(running);
    }
    ~Watched() {
      if (running->stop != nullptr) stop_watcher->Remove(running);
    }
    StopWatcher::Running* running;
  } watched(&running);
  Ref values(PyList_New(static_cast<Py_ssize_t>(args.size())));
  Ref tensor_indices(PyList_New(0));
  if (!values || !tensor_indices) {
    TakeException(error);
    return false;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    PyObject* value = ToPython(args[i]);
    if (value == nullptr) {
      TakeException(error);
      return false;
    }
    PyList_SET_ITEM(values.get(), static_cast<Py_ssize_t>(i), value);  // Steals.
    if (args[i].isTensor()) {
      Ref index(PyLong_FromSize_t(i));
      if (!index || PyList_Append(tensor_indices.get(), index.get()) != 0) {
        TakeException(error);
        return false;
      }
    }
  }
  args.clear();  // The capsules hold the tensors now.
  Ref result(PyObject_CallFunctionObjArgs(interpreter->run, static_cast<PyObject*>(program),
                                          values.get(), tensor_indices.get(), nullptr));
  if (!result) {
    error->stopped = running.stopped && PyErr_ExceptionMatches(interpreter->stopped);
    TakeException(error);
    return false;
  }
  if (!PyList_Check(result.get())) {
    error->message = "precompile_eager.run returned no list";
    return false;
  }
  const Py_ssize_t n = PyList_GET_SIZE(result.get());
  leaves->assign(static_cast<size_t>(n), c10::IValue());
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!FromPython(PyList_GET_ITEM(result.get(), i), &(*leaves)[static_cast<size_t>(i)], error)) {
      leaves->clear();
      return false;
    }
  }
  return true;
}

void Release(void* program) {
  Gil gil;
  Py_DECREF(static_cast<PyObject*>(program));
}

const PythonPlugin kPlugin = {
    kPythonPluginAbi, Start, CheckEnvironment, ImportModule, Load, Run, Release,
};

}  // namespace
}  // namespace precompile

extern "C" __attribute__((visibility("default"))) const precompile::PythonPlugin*
PrecompilePythonPlugin() {
  return &precompile::kPlugin;
}
