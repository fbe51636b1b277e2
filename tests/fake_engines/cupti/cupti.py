"""A stand-in for cupti-python: hands back what the fake binding recorded, of the activity kinds enabled while it ran."""
import enum
import time
from types import SimpleNamespace

import llama_cpp


class ActivityKind(enum.IntEnum):
    DRIVER = 5
    RUNTIME = 6
    CONCURRENT_KERNEL = 10
    GRAPH_TRACE = 48


class driver_api_trace_cbid(enum.IntEnum):
    cuGraphLaunch = 514
    cuGraphLaunch_ptsz = 515


class runtime_api_trace_cbid(enum.IntEnum):
    cudaGraphLaunch_v10000 = 311
    cudaGraphLaunch_ptsz_v10000 = 312


class cuptiError(Exception):
    pass


_done = []


def activity_register_callbacks(requested, completed):
    _done.append(completed)


def activity_enable(kind):
    llama_cpp.ACTIVE.add(ActivityKind(kind))


def activity_disable(kind):
    llama_cpp.ACTIVE.discard(ActivityKind(kind))


def activity_enable_driver_api(cbid, on):
    (llama_cpp.ACTIVE.add if on else llama_cpp.ACTIVE.discard)("launch calls")


activity_enable_runtime_api = activity_enable_driver_api


def get_timestamp():
    return time.perf_counter_ns()


def activity_flush_all(flag):
    kernels = [SimpleNamespace(kind=ActivityKind.CONCURRENT_KERNEL, name=n, grid_x=g[0], grid_y=g[1], grid_z=g[2],
                               block_x=b[0], block_y=b[1], block_z=b[2], graph_id=graph, start=s, end=e)
               for n, g, b, graph, s, e in llama_cpp.RECORDS]
    graphs = [SimpleNamespace(kind=ActivityKind.GRAPH_TRACE, graph_id=graph, correlation_id=c, start=s, end=e)
              for graph, c, s, e in llama_cpp.GRAPHS]
    calls = [SimpleNamespace(kind=ActivityKind.RUNTIME, correlation_id=c, start=s) for c, s in llama_cpp.CALLS]
    _done[0](kernels + graphs + calls)
