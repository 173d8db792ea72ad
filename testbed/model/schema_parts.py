"""The JSON schema of each topology key whose form no registry decides: one mapping per
section, keyed like the loader's own key lists. :mod:`testbed.model.schema` assembles them
with what the registries declare (backends, link types) and refuses a section whose keys
here differ from the loader's, so a key added to the loader fails the schema test until
its schema is written here."""

from __future__ import annotations

_NUM = r"([0-9]+(\.[0-9]*)?|\.[0-9]+)"
_PERIOD = {"type": "string", "pattern": rf"^\s*{_NUM}\s*([mM][sS]|[sS]|[mM][iI][nN])\s*$",
           "description": "mean period, e.g. 2s, 500ms, 1min (exponentially distributed, seeded)"}

VALUES = {
    "rate": {"type": "string", "pattern": rf"^\s*{_NUM}\s*[kKmMgGtT]?[bB][iI][tT]\s*$",
             "description": "bits per second in tc's decimal units: bit, kbit, mbit, gbit, tbit (8kbit..400gbit); "
                            "'mbps' is refused (tc reads it as megabytes/s)"},
    "duration": {"anyOf": [{"type": "string", "pattern": rf"^\s*(0|{_NUM}\s*([uUmM]?[sS]))\s*$"}, {"const": 0}],
                 "description": "us, ms or s, e.g. 10ms (at most 60s); needs netem"},
    "loss": {"anyOf": [{"type": "string", "pattern": rf"^\s*{_NUM}\s*%\s*$"}, {"const": 0}],
             "description": "a percentage, e.g. 0.1%; needs netem"},
    "limit": {"type": "integer", "minimum": 1, "maximum": 10000000, "description": "queue limit in packets"},
    "sysctls": {"type": "object", "description": "network sysctls set in each worker's namespace (net.* only), "
                                                 "e.g. net.ipv4.tcp_congestion_control: reno",
                "propertyNames": {"pattern": r"^net\.[a-z0-9_]+(\.[a-z0-9_-]+)+$"},
                "additionalProperties": {"anyOf": [{"type": "string", "pattern": "^[A-Za-z0-9_. :/-]{1,256}$"},
                                                   {"type": "integer"}]}},
}

SHAPE = {"rate": {"$ref": "#/$defs/rate"}, "delay": {"$ref": "#/$defs/duration"},
         "jitter": {"$ref": "#/$defs/duration", "description": "delay variation; needs delay"},
         "loss": {"$ref": "#/$defs/loss"}, "limit": {"$ref": "#/$defs/limit"}}

STEP = {
    "at": {"anyOf": [{"type": "string", "pattern": rf"^\s*{_NUM}\s*([mM][sS]|[sS]|[mM][iI][nN]|[hH])\s*$"},
                     {"const": 0}],
           "description": "when the step starts, from `up` (or the run's start): 30s, 500ms, 2min, 1h"},
    "rate": {"$ref": "#/$defs/rate"},
    "delay": {"anyOf": [{"$ref": "#/$defs/duration"}, {"type": "null"}, {"const": ""}]},
    "loss": {"anyOf": [{"$ref": "#/$defs/loss"}, {"type": "null"}, {"const": ""}]},
}

FLOW = {
    "from": {"type": "string", "minLength": 1, "description": "worker running the client"},
    "to": {"type": "string", "minLength": 1, "description": "worker running the server"},
    "flows": {"type": "integer", "minimum": 1, "maximum": 32, "description": "parallel streams (iperf3 -P)"},
    "rate": {"anyOf": [{"$ref": "#/$defs/rate"}, {"type": "null"}], "description": "pace the flow (iperf3 -b); default greedy"},
    "on": _PERIOD, "off": _PERIOD,
}

TOP = {
    "subnet": {"type": "string", "description": "IPv4 data-plane subnet, e.g. 10.77.0.0/16 (default: the first of "
                                                "10.200-254.0.0/16 clear of the host's routes)"},
    "traffic": {"type": "array", "items": {"$ref": "#/$defs/flow"},
                "description": "cross-traffic flows during every `testbed run` on this topology"},
}

DEFAULTS = {"link": {"$ref": "#/$defs/shape", "description": "shape of links that set none (built-in: 10gbit)"},
            "sysctls": {"$ref": "#/$defs/sysctls"}}

NODE = {
    "gpu": {"type": "integer", "minimum": 0, "description": "GPU index on its host"},
    "sysctls": {"$ref": "#/$defs/sysctls"},
    "stp": {"type": "boolean", "description": "allow loops through this switch"},
}

LINK = {
    "endpoints": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2},
    "bottleneck": {"type": "boolean", "description": "`--bw` and `link set --bottleneck` change these"},
    "forward": {"$ref": "#/$defs/shape", "description": "shape a->b, over the link's own keys"},
    "reverse": {"$ref": "#/$defs/shape", "description": "shape b->a, over the link's own keys"},
    "schedule": {"type": "array", "items": {"$ref": "#/$defs/step"}, "minItems": 1,
                 "description": "rate steps both directions follow from `up` on"},
    "loop": {"type": "boolean", "description": "repeat the schedule; its last step, equal to the first, marks the period"},
    **SHAPE,
}

HOST = {
    "address": {"type": "string", "description": "where SSH connects: an IPv4 address or a host name"},
    "underlay": {"type": "string",
                 "description": "this host's IPv4 address for VXLAN tunnels (default: address, which must then be IPv4)"},
    "port": {"type": "integer", "minimum": 1, "maximum": 65535, "default": 22},
    "key": {"type": "string", "minLength": 1, "description": "private key file (default: agent and ~/.ssh/id_*)"},
    "known_hosts": {"type": "string", "minLength": 1, "description": "host keys are checked here (default ~/.ssh/known_hosts)"},
    "accept_new_host_key": {"type": "boolean", "default": False,
                            "description": "trust a key seen for the first time (a changed key is refused always)"},
    "slurm": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
              "description": "this host is that node of a Slurm job, reached through srun (no SSH); "
                             "`testbed up --hosts slurm` writes it"},
    "slurm_job": {"type": "integer", "minimum": 1, "maximum": 2**32 - 1,
                  "description": "the Slurm job whose steps reach the node (default: the job testbed runs in)"},
}

TUNNEL = {"port": {"type": "integer", "minimum": 1024, "maximum": 65535,
                   "description": "first UDP port of the tunnel links (link i: port + i on both its hosts); "
                                  "default: derived from the testbed's name and your uid"}}
VXLAN = {"port": {"type": "integer", "minimum": 1, "maximum": 65535},
         "mtu": {"type": "integer", "minimum": 1280, "maximum": 9000,
                 "description": "data-plane MTU (default 1450 when a link crosses hosts)"}}
