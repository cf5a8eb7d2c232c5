# memscope capture's start-up module. `memscope capture --out RUN -- CMD`
# writes this file as RUN/.memscope-capture/sitecustomize.py and puts that
# directory first on PYTHONPATH, so every Python process of the job (and of
# torchrun's workers) runs it at start-up. It must never change what the job
# does: it imports nothing heavy, never imports torch itself, and any failure
# inside it is one line on stderr, never an exception into the job.
#
# What it does, once the job imports torch (a post-import hook):
# - marks the training phases with torch.autograd.profiler.record_function
#   scopes named the way memscope's snapshot importer reads them
#   (docs/snapshot-format.md): zero_grad:N, forward:N, loss:N, backward:N and
#   step:N, N the optimizer step;
# - when CUDA is available, turns on torch.cuda.memory._record_memory_history
#   (stacks, a ring of $MEMSCOPE_CAPTURE_MAX_ENTRIES entries) as the job
#   initialises CUDA (torch.cuda._lazy_call: no CUDA context is created that
#   the job would not create), and writes RUN/snapshot-rank-R.pickle (R =
#   $RANK, default 0) at exit and at an OOM;
# - writes RUN/.memscope-capture/rank-R.json (what this rank captured), which
#   memscope reads to describe the run in run.json.
#
# The user's own sitecustomize (the next one on sys.path) is loaded after
# this one and becomes the `sitecustomize` module, as if memscope were not
# there; this directory is removed from sys.path again.
import os
import sys


def _memscope_capture_main():
    here = os.path.dirname(os.path.abspath(__file__))
    run_dir = os.environ.get("MEMSCOPE_CAPTURE_DIR", os.path.dirname(here))
    state = {
        "torch": None,
        "history": False,
        "phases": 0,
        "oom_dumps": 0,
        "snapshot": None,
        "error": None,
        "step": 0,  # the global step: the largest step count of any optimizer
        "open": None,  # the phase scope open now ("zero_grad", "forward", "backward", "step"), or None
        "loss": None,  # the open loss scope (record_function), between a forward and backward
    }

    def say(text):
        try:
            sys.stderr.write("memscope capture: " + " ".join(str(text).split()) + "\n")
            sys.stderr.flush()
        except Exception:
            pass

    def failed(what, e):
        state["error"] = "%s: %s: %s" % (what, type(e).__name__, e)
        say("%s failed (the job goes on): %s: %s" % (what, type(e).__name__, e))

    def env_int(name, default):
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default

    rank = env_int("RANK", 0)
    max_entries = env_int("MEMSCOPE_CAPTURE_MAX_ENTRIES", 1000000)

    def is_launcher():
        # torchrun's agent (torch.distributed.run / launch): it starts the
        # workers; they capture, it does not.
        argv = list(getattr(sys, "orig_argv", None) or [])
        for k, a in enumerate(argv):
            if a == "-m" and k + 1 < len(argv):
                return argv[k + 1] in ("torch.distributed.run", "torch.distributed.launch")
        main = sys.argv[0] if sys.argv else ""
        return os.path.basename(main) == "torchrun" or main.replace("\\", "/").endswith(
            ("torch/distributed/run.py", "torch/distributed/launch.py"))

    def write_status():
        if not (state["history"] or state["phases"]):
            return  # nothing captured here (a launcher, a helper process)
        import json
        status = {
            "rank": rank,
            "world_size": env_int("WORLD_SIZE", 1),
            "local_rank": env_int("LOCAL_RANK", 0),
            "pid": os.getpid(),
            "torch": getattr(state["torch"], "__version__", None),
            "cuda": state["history"],
            "phases": state["phases"],
            "steps": state["step"],
            "oom_dumps": state["oom_dumps"],
            "snapshot": state["snapshot"],
            "error": state["error"],
        }
        path = os.path.join(here, "rank-%d.json" % rank)
        tmp = "%s.tmp%d" % (path, os.getpid())
        with open(tmp, "w") as f:
            json.dump(status, f)
        os.replace(tmp, path)

    def dump_snapshot(why):
        import pickle
        snapshot = state["torch"].cuda.memory._snapshot()
        name = "snapshot-rank-%d.pickle" % rank
        path = os.path.join(run_dir, name)
        tmp = "%s.tmp%d" % (path, os.getpid())
        with open(tmp, "wb") as f:
            pickle.dump(snapshot, f)
        os.replace(tmp, path)
        state["snapshot"] = name

    # ---- Phase scopes (record_function), named as memscope reads them.

    def scope(name):
        rf = state["torch"].autograd.profiler.record_function(name)
        rf.__enter__()
        state["phases"] += 1
        return rf

    def close(rf):
        if rf is not None:
            rf.__exit__(None, None, None)

    def end_loss():
        rf, state["loss"] = state["loss"], None
        close(rf)

    def phase(kind, label, call):
        # Runs call() inside the scope `label`, unless one of our phases is
        # already open (nested calls: an optimizer whose step calls its
        # parent's, Tensor.backward calling torch.autograd.backward, a
        # checkpointed forward recomputed in backward).
        if state["open"] is not None:
            return call()
        rf = None
        try:
            end_loss()
            rf = scope(label)
            state["open"] = kind
        except Exception as e:
            failed("marking " + label, e)
            return call()
        try:
            return call()
        finally:
            state["open"] = None
            try:
                close(rf)
            except Exception as e:
                failed("closing " + label, e)

    def install_phases(torch):
        import functools
        import threading
        import weakref

        from torch.nn.modules.loss import _Loss

        steps = weakref.WeakKeyDictionary()  # optimizer -> its steps done
        local = threading.local()  # module call depth, per thread

        def compiling():
            c = getattr(torch, "compiler", None)
            f = getattr(c, "is_compiling", None)
            return bool(f and f())

        # The outermost module call is forward:N; from its end to backward
        # (or the next phase) is loss:N. A loss module (nn.MSELoss...) belongs
        # to the loss.
        real_call = torch.nn.Module.__call__

        def module_call(module, *args, **kwargs):
            depth = getattr(local, "depth", 0)
            if depth or state["open"] is not None or isinstance(module, _Loss) or compiling():
                local.depth = depth + 1
                try:
                    return real_call(module, *args, **kwargs)
                finally:
                    local.depth = depth

            def call():
                local.depth = 1
                try:
                    return real_call(module, *args, **kwargs)
                finally:
                    local.depth = 0

            result = phase("forward", "forward:%d" % state["step"], call)
            try:
                if state["open"] is None and state["loss"] is None:
                    state["loss"] = scope("loss:%d" % state["step"])
            except Exception as e:
                failed("marking loss", e)
            return result

        functools.update_wrapper(module_call, real_call)
        torch.nn.Module.__call__ = module_call

        def wrap_backward(real):
            @functools.wraps(real)
            def backward(*args, **kwargs):
                return phase("backward", "backward:%d" % state["step"], lambda: real(*args, **kwargs))

            return backward

        torch.Tensor.backward = wrap_backward(torch.Tensor.backward)
        torch.autograd.backward = wrap_backward(torch.autograd.backward)

        # Optimizers: subclasses override step (and may override
        # zero_grad), so each optimizer class gets its wrappers when its
        # first instance is made, after PyTorch's own profiling hook.
        def wrap_step(real):
            @functools.wraps(real)
            def step(self, *args, **kwargs):
                try:
                    done = steps.get(self, 0)
                except TypeError:  # not weakly referenceable: the global step
                    done = state["step"]
                if state["open"] is not None:
                    return real(self, *args, **kwargs)

                def call():
                    result = real(self, *args, **kwargs)
                    try:
                        steps[self] = done + 1
                    except TypeError:
                        pass
                    state["step"] = max(state["step"], done + 1)
                    return result

                return phase("step", "step:%d" % done, call)

            step.__memscope_phase__ = True
            return step

        def wrap_zero_grad(real):
            @functools.wraps(real)
            def zero_grad(self, *args, **kwargs):
                return phase("zero_grad", "zero_grad:%d" % state["step"], lambda: real(self, *args, **kwargs))

            zero_grad.__memscope_phase__ = True
            return zero_grad

        def wrap_class(cls):
            for name, wrap in (("step", wrap_step), ("zero_grad", wrap_zero_grad)):
                f = getattr(cls, name, None)
                if f is not None and not getattr(f, "__memscope_phase__", False):
                    setattr(cls, name, wrap(f))

        real_init = torch.optim.Optimizer.__init__

        @functools.wraps(real_init)
        def init(self, *args, **kwargs):
            real_init(self, *args, **kwargs)
            try:
                wrap_class(type(self))
            except Exception as e:
                failed("marking the optimizer's phases", e)

        torch.optim.Optimizer.__init__ = init

    # ---- Memory history (CUDA only).

    def enable_history():
        # Called by torch.cuda._lazy_call as the job initialises CUDA.
        try:
            torch = state["torch"]
            record = torch.cuda.memory._record_memory_history
            import inspect
            params = inspect.signature(record).parameters
            if "max_entries" in params:  # PyTorch 2.1+
                record(enabled="all", context="all", stacks="all", max_entries=max_entries)
            elif "trace_alloc_max_entries" in params:  # PyTorch 2.0
                record(True, trace_alloc_max_entries=max_entries, trace_alloc_record_context=True)
            else:  # PyTorch 1.13: no trace, the state only
                record(True)
            state["history"] = True
            observe = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
            if observe is not None:
                observe(on_oom)
            write_status()
        except Exception as e:
            failed("turning on torch.cuda.memory._record_memory_history", e)

    def on_oom(device, alloc, device_allocated, device_free):
        try:
            dump_snapshot("oom")
            state["oom_dumps"] += 1
            write_status()
        except Exception as e:
            failed("writing the snapshot at the OOM", e)

    def at_exit():
        try:
            end_loss()
        except Exception:
            pass
        if state["history"]:
            try:
                dump_snapshot("exit")
            except Exception as e:
                failed("writing the snapshot at exit", e)
        try:
            write_status()
        except Exception as e:
            failed("writing its rank status", e)

    def on_torch(torch):
        try:
            import multiprocessing

            if is_launcher() or multiprocessing.parent_process() is not None:
                return  # torchrun's agent, a DataLoader worker: not a rank of the job
        except Exception:
            pass
        state["torch"] = torch
        try:
            install_phases(torch)
        except Exception as e:
            failed("marking the phases", e)
        try:
            if torch.cuda.is_available():
                torch.cuda._lazy_call(enable_history)
            elif rank == 0:
                say("no CUDA device (torch.cuda.is_available() is False): no memory snapshot is written; "
                    "the phases are still marked")
        except Exception as e:
            failed("turning on the memory history", e)
        import atexit

        atexit.register(at_exit)

    # ---- The post-import hook: on_torch runs once torch/__init__ has run.

    class TorchHook:
        def find_spec(self, fullname, path=None, target=None):
            if fullname != "torch":
                return None
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
            import importlib.util

            spec = importlib.util.find_spec(fullname)
            loader = getattr(spec, "loader", None)
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            real_exec = loader.exec_module

            def exec_module(module):
                real_exec(module)
                try:
                    del loader.exec_module
                except AttributeError:
                    pass
                try:
                    on_torch(module)
                except Exception as e:
                    failed("setting up", e)

            loader.exec_module = exec_module
            return spec

    if "torch" in sys.modules:
        on_torch(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, TorchHook())


def _memscope_user_sitecustomize():
    # This directory leaves sys.path; the next sitecustomize on it (the
    # user's, or the distribution's) runs and becomes `sitecustomize`.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        # What site.py says of a failing sitecustomize.
        sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s\n" % (type(e).__name__, e))


try:
    _memscope_capture_main()
except Exception as _e:
    sys.stderr.write("memscope capture: setting up failed (the job goes on): %s\n" % " ".join(repr(_e).split()))
_memscope_user_sitecustomize()
