"""What unit tests of more than one module share: stand-ins for the OS and the native library
(the runtime's), a node's feed of three jobs, and the Lua helper that reads a chunk's locals.
No test module imports another; they import these."""
from malleable_policy.request import MalleableSpec
from slurm_plugin.cgroups import CgroupVersion, SlurmCgroupLayout
from slurm_plugin.feed import FeedJob, FeedStore, NodeFeed


# --- malleable_tf's runtime: the native library and the OS readers -------------------------

class FakeLib:
    def __init__(self, calls):
        self.calls = calls
        self.parked = {0: 0, 1: 0}

    def mtf_set_parked(self, pool, n):
        self.calls.append(("park", pool, n))
        self.parked[pool] = n
        return 0

    def mtf_set_split_width(self, n, shard_too):
        self.calls.append(("split", n))
        return 0

    def mtf_gate_set_capacity(self, n):
        self.calls.append(("gate", n))
        return 0

    def mtf_wait_settled(self, pool, timeout_ms):
        return self.parked[pool]

    def mtf_poll_stop(self):
        pass    # no poller runs in these tests

    def mtf_shutdown(self):
        self.calls.append(("shutdown",))


class FakeNative:
    def __init__(self, calls):
        self.lib = FakeLib(calls)


def fake_tf_adapter(calls, pool: int, inter: int | None = None, **options):
    """TensorFlow's adapter (pools and wake-ups) on the fake native library: the arguments the
    runtime takes first."""
    from malleable_tf.pools import NativeWakeups, TfPools
    native = FakeNative(calls)
    return (TfPools(native, intra_pool=pool, inter_pool=pool if inter is None else inter,
                    **options), NativeWakeups(native))


class World:
    def __init__(self, cpus):
        self.mask = frozenset(cpus)
        self.cpuset_cpus = None
        self.quota_cpus = None
        self.invalidations = 0
        self.calls = []

    # The CgroupReader interface.
    def cpuset(self):
        return self.cpuset_cpus

    def quota(self):
        return self.quota_cpus

    def invalidate(self):
        self.invalidations += 1

    def pin(self, cpus):
        self.calls.append(("pin", tuple(sorted(cpus))))
        self.mask = frozenset(cpus)   # pinning changes what the main thread's mask reads


# --- the cluster's feed -------------------------------------------------------------------

def feed_of_three_jobs(store: FeedStore, node: str = "n1") -> None:
    """Alice's malleable job 1 and rigid job 3, Bob's malleable job 2, a core each on a
    4-core node."""
    store.write_node(NodeFeed(node, 4, (
        FeedJob(1, 1000, "alice", frozenset({0}), (node,), MalleableSpec(1, None)),
        FeedJob(2, 1001, "bob", frozenset({1}), (node,), MalleableSpec(1, None)),
        FeedJob(3, 1000, "alice", frozenset({2}), (node,), None))))


# --- job_submit.lua -----------------------------------------------------------------------

# A Lua function that finds a local (an upvalue) of a loaded chunk's function by name.
LUA_UPVALUE = """
function upvalue(f, name, depth)
   depth = depth or 2
   local tables = {}
   for i = 1, 255 do
      local n, v = debug.getupvalue(f, i)
      if n == nil then break end
      if n == name then return v end
      if type(v) == "table" then tables[#tables + 1] = v end
   end
   if depth == 0 then return nil end
   for _, t in ipairs(tables) do
      for _, g in pairs(t) do
         if type(g) == "function" then
            local found = upvalue(g, name, depth - 1)
            if found ~= nil then return found end
         end
      end
   end
end
"""


# --- a node's observer: its feed and its cgroup tree ---------------------------------------

class FakeFeed:
    def __init__(self, feed=None, offers=None):
        self.feed, self.offers = feed, offers or {}

    def read_node(self, node):
        return self.feed

    def read_offers(self, node):
        return self.offers.get(node)


class FakeCgroups:
    layout = SlurmCgroupLayout.named("n1", CgroupVersion.V1, multiple_slurmd=True)

    def __init__(self, jobs, unidentified=None):
        self.jobs = jobs
        # Job folders named by a SLUID no slurmstepd tells yet (CpusetActuator.unidentified).
        self.unidentified = dict(unidentified or {})

    def scan(self):
        return dict(self.jobs)

    def node_cpus(self):
        return frozenset()
