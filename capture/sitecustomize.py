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
#   the job would not create), and writes RUN/snapshot-rank-R.pickle at exit
#   and at an OOM;
# - writes RUN/.memscope-capture/rank-R.json (what this rank captured), which
#   memscope reads to describe the run in run.json;
# - with --all-device-memory, at each phase end asks memscope's CUPTI
#   injection library ($MEMSCOPE_DEVICE_LIBRARY, loaded by the CUDA driver,
#   never by this module) for an NVML sample of the process's GPU memory.
#
# The rank R: torch.distributed's, once the job's process group exists (its
# init_process_group is wrapped to learn it; torch.multiprocessing.spawn sets
# no $RANK), else $RANK as torchrun sets it, else 0. A process claims its
# rank's file names (an O_EXCL file, claim-rank-R) before it first writes
# them; a second process reporting the same rank never overwrites the first
# one's files: it writes rank-R.pid-P.json and snapshot-rank-R.pid-P.pickle,
# which memscope keeps and names in a note.
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

    dist = {"rank": None, "world_size": None}  # from torch.distributed, once known
    claimed = {}  # rank -> the suffix of this process's file names ("" or ".pid-P")
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

    def learn_rank():
        # torch.distributed's rank and world size, if its process group exists.
        try:
            d = state["torch"].distributed
            if d.is_available() and d.is_initialized():
                dist["rank"], dist["world_size"] = d.get_rank(), d.get_world_size()
        except Exception:
            pass

    def rank_known():
        return dist["rank"] is not None or "RANK" in os.environ

    def rank_now():
        if dist["rank"] is None:
            learn_rank()
        return dist["rank"] if dist["rank"] is not None else env_int("RANK", 0)

    def world_size_now():
        return dist["world_size"] if dist["world_size"] is not None else env_int("WORLD_SIZE", 1)

    def suffix_for(rank):
        # "" when this process owns rank's file names, else ".pid-P" (another
        # process of the job claimed them first: its files are not overwritten).
        if rank in claimed:
            return claimed[rank]
        path = os.path.join(here, "claim-rank-%d" % rank)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            claimed[rank] = ""
        except FileExistsError:
            try:
                with open(path) as f:
                    owner = f.read().strip()
            except OSError:
                owner = "?"
            claimed[rank] = "" if owner == str(os.getpid()) else ".pid-%d" % os.getpid()
            if claimed[rank]:
                say("rank %d is also process %s's: this process (%d) writes rank-%d%s.json, not over its files"
                    % (rank, owner, os.getpid(), rank, claimed[rank]))
        return claimed[rank]

    def write_status(final=False):
        if not (state["history"] or state["phases"]):
            return  # nothing captured here (a launcher, a helper process)
        if not final and not rank_known():
            return  # written at exit, once the rank is known
        import json
        rank = rank_now()
        suffix = suffix_for(rank)
        status = {
            "rank": rank,
            "world_size": world_size_now(),
            "local_rank": env_int("LOCAL_RANK", 0) if "LOCAL_RANK" in os.environ else None,  # spawn sets none
            "pid": os.getpid(),
            "torch": getattr(state["torch"], "__version__", None),
            "cuda": state["history"],
            "phases": state["phases"],
            "steps": state["step"],
            "oom_dumps": state["oom_dumps"],
            "snapshot": state["snapshot"],
            "error": state["error"],
        }
        path = os.path.join(here, "rank-%d%s.json" % (rank, suffix))
        tmp = "%s.tmp%d" % (path, os.getpid())
        with open(tmp, "w") as f:
            json.dump(status, f)
        os.replace(tmp, path)

    def dump_snapshot(why):
        import pickle
        snapshot = state["torch"].cuda.memory._snapshot()
        rank = rank_now()
        name = "snapshot-rank-%d%s.pickle" % (rank, suffix_for(rank))
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
        if state["phases"] == 1:
            say_no_gpu()
        return rf

    def say_no_gpu():
        # Once per job: by the first process to mark a phase (a spawn or
        # torchrun launcher marks none), which claims the line (O_EXCL).
        try:
            if not state["torch"].cuda.is_available():
                os.close(os.open(os.path.join(here, "claim-no-gpu-line"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                say("no CUDA device (torch.cuda.is_available() is False): no memory snapshot is written; "
                    "the phases are still marked")
        except Exception:
            pass

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
                device_sample(label)
            except Exception as e:
                failed("closing " + label, e)

    def device_sample(label):
        # --all-device-memory: NVML's used memory at each phase end, sampled by
        # the CUPTI injection library that the CUDA driver loaded into this
        # process (RTLD_NOLOAD: never loaded here; before CUDA starts, nothing).
        path = os.environ.get("MEMSCOPE_DEVICE_LIBRARY")
        if not path:
            return
        if state.get("device_library") is None:
            import ctypes
            try:
                state["device_library"] = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            except OSError:
                return  # not loaded yet: CUDA has not started in this process
        state["device_library"].memscope_device_sample(label.encode("utf-8", "replace"))

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

    def install_rank_hook(torch):
        # The rank as the job's process group has it, learnt as it is made.
        import functools

        d = getattr(torch, "distributed", None)
        real = getattr(d, "init_process_group", None) if d is not None else None
        if real is None:
            return

        @functools.wraps(real)
        def init_process_group(*args, **kwargs):
            result = real(*args, **kwargs)
            learn_rank()
            return result

        d.init_process_group = init_process_group

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
            write_status(final=True)
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
            install_rank_hook(torch)
        except Exception as e:
            failed("reading the rank from torch.distributed", e)
        try:
            if torch.cuda.is_available():
                torch.cuda._lazy_call(enable_history)
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
