#!/usr/bin/env python3
"""End-to-end tests of the pipeswap command: every subcommand on small cases with outputs worked out
by hand from the documented rules (docs/schedules.md, docs/cli.md), the error paths with their exit
statuses and messages, `simulate` with its trace and SVG parsed back, and the built-in scenario's
report checked against the formulas of docs/simulator.md worked out by hand.

    python3 cli_test.py path/to/pipeswap [unittest arguments]
"""
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

PIPESWAP = None  # set from argv
SVG_NS = "{http://www.w3.org/2000/svg}"

# The step codes of the text form (docs/schedules.md).
CODES = {
    "FWD": "F", "BWD": "B", "FWD_RECV": "FR", "FWD_SEND": "FS", "BWD_RECV": "BR", "BWD_SEND": "BS",
    "SWAP_SET_GROUP": "SG", "SWAP_LAUNCH_OFFLOAD": "LO", "SWAP_WAIT_OFFLOAD": "WO",
    "SWAP_LAUNCH_LOAD": "LL", "SWAP_WAIT_LOAD": "WL", "BWD_INPUT": "BI", "BWD_WEIGHT": "BW",
}
KINDS = {v: k for k, v in CODES.items()}

# A small scenario: 8 layers on 4 ranks, 8 micro-batches; the device is large enough for the
# weights and gradients but not for everything without swap.
TINY = {
    "model": {"name": "tiny", "layers": 8, "hidden": 512, "ffn_hidden": 1024, "heads": 8, "kv_heads": 4,
              "vocab": 1000, "seq_len": 512},
    "device": {"name": "small", "memory_bytes": 120_000_000, "reserved_bytes": 10_000_000},
    "pipeline": {"ranks": 4, "micro_batches": 8},
    "swap": {"swap_times": 4, "overlap": False},  # the reference step: the hand computations below
}


def rank_params(model, ranks, rank):
    """(parameters, parameters of tensors under 1024 elements) of `rank`, one stage per rank, by the
    formulas of docs/simulator.md: per layer q, o (h*h), k, v (h*h*kv/a), gate, up, down (h*f) and two
    norms (h); the embedding (vocab*h) on the first stage, the final norm (h) and the head (vocab*h)
    on the last; layers as even as possible, the first stages taking the remainder."""
    h, f, a, kv = model["hidden"], model["ffn_hidden"], model["heads"], model["kv_heads"]
    layers = model["layers"] // ranks + (1 if rank < model["layers"] % ranks else 0)
    tensors = [h * h, h * h, h * h * kv // a, h * h * kv // a, h * f, h * f, h * f, h, h] * layers
    if rank == 0:
        tensors.append(model["vocab"] * h)
    if rank == ranks - 1:
        tensors += [h, model["vocab"] * h]
    return sum(tensors), sum(t for t in tensors if t < 1024)


def run(*args, stdin=None, check=None):
    """Runs pipeswap; returns (exit status, stdout, stderr)."""
    p = subprocess.run([PIPESWAP, *args], input=stdin, capture_output=True, text=True, timeout=600)
    if check is not None and p.returncode != check:
        raise AssertionError(f"pipeswap {' '.join(args)}: exit {p.returncode}, expected {check}\n"
                             f"stdout: {p.stdout[:2000]}\nstderr: {p.stderr[:2000]}")
    return p.returncode, p.stdout, p.stderr


def step_text(s):
    if s is None:
        return "_"
    if s.get("sub"):
        return "[" + "|".join(step_text(x) for x in s["sub"]) + "]"
    return f"{CODES[s['type']]}{s['stage']}.{s['micro']}"


def order_text(order):
    return " ".join(step_text(e) for e in order)


def order_json(text):
    """The JSON form of an order in the text form (leaves and bubbles only)."""
    out = []
    for tok in text.split():
        if tok == "_":
            out.append(None)
            continue
        m = re.fullmatch(r"([A-Z]+)(\d+)\.(\d+)", tok)
        out.append({"type": KINDS[m.group(1)], "stage": int(m.group(2)), "micro": int(m.group(3))})
    return out


class Help(unittest.TestCase):
    def test_every_subcommand_has_help(self):
        status, out, _ = run("--help")
        self.assertEqual(status, 0)
        for sub in ("simulate", "plan", "scenario", "schedule", "inject", "validate", "partition"):
            self.assertIn(sub, out)
        expected = {
            "simulate": ["--scenario", "--trace", "--svg", "--rank", "--json", "--progress"],
            "plan": ["--scenario", "--budget", "--json", "--progress"],
            "scenario": ["--scenario"],
            "schedule": ["--kind", "--ranks", "--micro", "--stages-per-rank", "--overlap-b-f", "--indent"],
            "inject": ["--min-gap", "--indent"],
            "validate": ["--stages-per-rank", "--placement", "--indent"],
            "partition": ["--policy", "--indent"],
        }
        for sub, options in expected.items():
            status, out, err = run(sub, "--help")
            self.assertEqual(status, 0, sub)
            self.assertEqual(err, "", sub)
            for o in options:
                self.assertIn(o, out, f"{sub} --help")

    def test_version(self):
        status, out, _ = run("--version")
        self.assertEqual(status, 0)
        self.assertRegex(out, r"^pipeswap \d+\.\d+\.\d+")

    def test_bad_arguments_exit_2(self):
        for args, message in [(("bogus",), "bogus"),
                              (("schedule", "--kind", "zb", "--ranks", "2", "--micro", "2"), "--kind"),
                              (("schedule", "--ranks", "2", "--micro", "2"), "--kind is required"),
                              (("simulate", "--progress", "sometimes"), "--progress"),
                              (("partition", "--policy", "greedy"), "--policy"),
                              (("plan", "--budget", "-3"), "--budget")]:
            status, out, err = run(*args)
            self.assertEqual(status, 2, args)
            self.assertEqual(out, "", args)
            self.assertIn(message, err, args)


class Schedule(unittest.TestCase):
    def schedule(self, *args):
        _, out, err = run("schedule", *args, check=0)
        self.assertEqual(err, "")
        j = json.loads(out)
        self.assertEqual(list(j), ["ranks"])
        return [order_text(o) for o in j["ranks"]]

    def test_1f1b_two_ranks_two_micro_batches(self):
        # Rank 0: min(R-s, M) = 2 warm-up forwards, the even rank sending after each but the last; no
        # steady state (M - 2 = 0); the cool-down's first receive is followed by the pending send.
        # Rank 1 (last): one warm-up forward, one steady (B, BS, FR, F) group, then the cool-down.
        self.assertEqual(self.schedule("--kind", "1f1b", "--ranks", "2", "--micro", "2"), [
            "F0.0 FS0.0 F0.1 BR0.0 FS0.1 B0.0 BR0.1 B0.1",
            "FR1.0 F1.0 B1.0 BS1.0 FR1.1 F1.1 B1.1 BS1.1",
        ])

    def test_gpipe_two_ranks_two_micro_batches(self):
        # Every forward ([FR] F [FS]) of the micro-batches, then every backward ([BR] B [BS]).
        self.assertEqual(self.schedule("--kind", "gpipe", "--ranks", "2", "--micro", "2"), [
            "F0.0 FS0.0 F0.1 FS0.1 BR0.0 B0.0 BR0.1 B0.1",
            "FR1.0 F1.0 FR1.1 F1.1 B1.0 BS1.0 B1.1 BS1.1",
        ])

    def test_interleaved_with_overlap_matches_the_documented_order(self):
        ranks = self.schedule("--kind", "interleaved", "--ranks", "2", "--micro", "4", "--stages-per-rank", "2",
                              "--overlap-b-f")
        self.assertEqual(len(ranks), 2)
        self.assertEqual(ranks[0], (
            "F0.0 FS0.0 F0.1 FS0.1 FR2.0 F2.0 FS2.0 FR2.1 F2.1 FS2.1 _ BR2.0 F0.2 FS0.2 [B2.0|F0.3] BS2.0 "
            "BR2.1 FS0.3 FR2.2 [B2.1|F2.2] BS2.1 BR0.0 FS2.2 FR2.3 [B0.0|F2.3] BR0.1 FS2.3 B0.1 BR2.2 _ B2.2 "
            "BS2.2 BR2.3 _ B2.3 BS2.3 BR0.2 _ B0.2 BR0.3 _ B0.3"))

    def test_indent_pretty_prints_the_same_json(self):
        _, compact, _ = run("schedule", "--kind", "1f1b", "--ranks", "3", "--micro", "4", check=0)
        _, pretty, _ = run("schedule", "--kind", "1f1b", "--ranks", "3", "--micro", "4", "--indent", "2", check=0)
        self.assertEqual(json.loads(compact), json.loads(pretty))
        self.assertEqual(compact.count("\n"), 1)
        self.assertGreater(pretty.count("\n"), 10)

    def test_generated_schedules_validate(self):
        for kind, extra in [("gpipe", []), ("1f1b", []), ("interleaved", ["--stages-per-rank", "2"]),
                            ("interleaved", ["--stages-per-rank", "3", "--overlap-b-f"])]:
            _, out, _ = run("schedule", "--kind", kind, "--ranks", "4", "--micro", "8", *extra, check=0)
            _, report, err = run("validate", stdin=out, check=0)
            j = json.loads(report)
            self.assertTrue(j["valid"], (kind, extra))
            self.assertEqual(j["problems"], [])
            self.assertEqual(j["deadlock"], [])

    def test_bad_parameters(self):
        for args, message in [
                (("--kind", "1f1b", "--ranks", "0", "--micro", "2"), "--ranks must be between 1 and 2147483647, got 0"),
                (("--kind", "gpipe", "--ranks", "2", "--micro", "-1"), "--micro must be between 1 and 2147483647, got -1"),
                (("--kind", "1f1b", "--ranks", "2", "--micro", "2", "--stages-per-rank", "2"), "--stages-per-rank 2 needs --kind interleaved"),
                (("--kind", "gpipe", "--ranks", "2", "--micro", "2", "--overlap-b-f"), "--overlap-b-f needs --kind interleaved")]:
            status, out, err = run("schedule", *args)
            self.assertEqual(status, 2, args)
            self.assertEqual(out, "")
            self.assertEqual(err, f"pipeswap schedule: {message}\n")


# docs/schedules.md, "Worked example": GPipe rank 0, four micro-batches, every chunk's backward four
# compute slots after its forward.
WORKED_IN = ("F0.0 FS0.0 F0.1 FS0.1 F0.2 FS0.2 F0.3 FS0.3 BR0.0 B0.0 BS0.0 BR0.1 B0.1 BS0.1 BR0.2 B0.2 BS0.2 "
             "BR0.3 B0.3 BS0.3")
WORKED_OUT = ("SG0.0 F0.0 FS0.0 LO0.0 SG0.1 F0.1 FS0.1 LO0.1 WO0.0 SG0.2 F0.2 FS0.2 LO0.2 WO0.1 LL0.0 SG0.3 "
              "F0.3 FS0.3 LO0.3 WO0.2 BR0.0 LL0.1 WL0.0 B0.0 BS0.0 WO0.3 BR0.1 LL0.2 WL0.1 B0.1 BS0.1 BR0.2 "
              "LL0.3 WL0.2 B0.2 BS0.2 BR0.3 WL0.3 B0.3 BS0.3")


class Inject(unittest.TestCase):
    def test_worked_example(self):
        _, out, err = run("inject", stdin=json.dumps(order_json(WORKED_IN)), check=0)
        self.assertEqual(err, "")
        self.assertEqual(order_text(json.loads(out)), WORKED_OUT)

    def test_from_a_file_argument(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(order_json(WORKED_IN), f)
        try:
            _, out, _ = run("inject", f.name, check=0)
            self.assertEqual(order_text(json.loads(out)), WORKED_OUT)
        finally:
            os.unlink(f.name)

    def test_min_gap_keeps_short_lived_chunks_on_the_device(self):
        # Every chunk of the worked example has a gap of exactly 4 slots.
        _, out, _ = run("inject", "--min-gap", "5", stdin=json.dumps(order_json(WORKED_IN)), check=0)
        self.assertEqual(order_text(json.loads(out)), WORKED_IN)
        _, out, _ = run("inject", "--min-gap", "4", stdin=json.dumps(order_json(WORKED_IN)), check=0)
        self.assertEqual(order_text(json.loads(out)), WORKED_OUT)

    def test_injected_order_passes_the_order_check(self):
        _, out, _ = run("inject", stdin=json.dumps(order_json(WORKED_IN)), check=0)
        _, report, _ = run("validate", stdin=out, check=0)
        self.assertTrue(json.loads(report)["valid"])

    def test_bad_input(self):
        for stdin, message in [
                ('{"ranks": []}', "pipeswap inject: input: expected one order (a JSON array), got an object\n"),
                ("[1", "pipeswap inject: input: malformed JSON at byte 3"),
                ('[{"type": "FWD", "stage": 0, "micor": 1}]', "entry 0"),
                ('[{"type": "JUMP", "stage": 0, "micro": 0}]', "JUMP"),
                ("7", "pipeswap inject: input: expected an order (a JSON array), got number\n")]:
            status, out, err = run("inject", stdin=stdin)
            self.assertEqual(status, 2, stdin)
            self.assertEqual(out, "", stdin)
            self.assertIn(message, err, stdin)
        status, _, err = run("inject", "/nonexistent/order.json")
        self.assertEqual(status, 2)
        self.assertEqual(err, "pipeswap inject: cannot open '/nonexistent/order.json': No such file or directory\n")


class Validate(unittest.TestCase):
    def test_deadlock_is_found_and_exits_1(self):
        # docs/schedules.md: rank 0 waits for gradient 0 before sending activation 0; rank 1 waits for
        # that activation before it can compute and send the gradient.
        ranks = [order_json("F0.0 BR0.0 FS0.0 B0.0"), order_json("FR1.0 F1.0 B1.0 BS1.0")]
        status, out, err = run("validate", stdin=json.dumps({"ranks": ranks}))
        self.assertEqual(status, 1)
        self.assertEqual(err, "pipeswap validate: 0 problems and a deadlock\n")
        j = json.loads(out)
        self.assertFalse(j["valid"])
        self.assertEqual(j["problems"], [])
        self.assertEqual(j["deadlock"], [
            {"rank": 0, "position": 1, "step": "BR0.0", "peer_rank": 1, "peer_position": 3, "peer_step": "BS1.0"},
            {"rank": 1, "position": 0, "step": "FR1.0", "peer_rank": 0, "peer_position": 2, "peer_step": "FS0.0"},
        ])
        self.assertEqual(j["stages_per_rank"], 1)
        self.assertEqual(j["placement"], "loop")

    def test_label_cycle_that_runs_with_posted_sends_is_valid(self):
        ranks = [order_json("F0.0 FS0.0 F0.1 FS0.1 BR0.0 B0.0 BR0.1 B0.1"),
                 order_json("FR1.0 F1.0 B1.0 BS1.0 FR1.1 F1.1 B1.1 BS1.1")]
        _, out, err = run("validate", stdin=json.dumps({"ranks": ranks}), check=0)
        self.assertEqual(err, "")
        self.assertEqual(json.loads(out), {"stages_per_rank": 1, "placement": "loop", "valid": True, "problems": [],
                                           "deadlock": []})

    def test_one_order_with_problems(self):
        status, out, err = run("validate", stdin=json.dumps(order_json("F0.0 F0.0 B0.1")))
        self.assertEqual(status, 1)
        self.assertEqual(err, "pipeswap validate: 2 problems\n")
        j = json.loads(out)
        self.assertEqual([(p["rule"], p["position"], p["step"]) for p in j["problems"]],
                         [("duplicate", 1, "F0.0"), ("backward-before-forward", 2, "B0.1")])
        self.assertTrue(all(p["rank"] is None and p["message"] for p in j["problems"]))
        self.assertNotIn("stages_per_rank", j)

    def test_unpaired_and_misplaced_steps(self):
        ranks = [order_json("F0.0 FS0.0"), order_json("F0.0")]  # rank 1 runs a stage of rank 0
        status, out, _ = run("validate", stdin=json.dumps({"ranks": ranks}))
        self.assertEqual(status, 1)
        rules = sorted({p["rule"] for p in json.loads(out)["problems"]})
        self.assertEqual(rules, ["placement", "unpaired"])

    def test_chunks_and_placement(self):
        _, out, _ = run("schedule", "--kind", "interleaved", "--ranks", "2", "--micro", "4", "--stages-per-rank", "2", check=0)
        _, report, _ = run("validate", stdin=out, check=0)
        self.assertEqual(json.loads(report)["stages_per_rank"], 2)  # inferred from the highest stage
        status, report, _ = run("validate", "--placement", "v", stdin=out)
        self.assertEqual(status, 1)  # the loop schedule breaks the v placement
        self.assertIn("placement", {p["rule"] for p in json.loads(report)["problems"]})

    def test_bad_input(self):
        for stdin, message in [('{"ranks": [], "x": 1}', "unknown key 'x'"),
                               ("{}", "input: missing 'ranks'"),
                               ('{"ranks": []}', "'ranks' holds no order"),
                               ('"F0.0"', "got string"),
                               ('[{"type": "FWD", "stage": -1, "micro": 0}]', "entry 0")]:
            status, out, err = run("validate", stdin=stdin)
            self.assertEqual(status, 2, stdin)
            self.assertEqual(out, "")
            self.assertIn(message, err, stdin)
            self.assertTrue(err.startswith("pipeswap validate: "), err)


class Partition(unittest.TestCase):
    def partition(self, data, *args):
        _, out, err = run("partition", *args, stdin=json.dumps(data), check=0)
        self.assertEqual(err, "")
        return json.loads(out)

    def test_reference_rule(self):
        # costs 5 3 8 1 4 in 2 batches: the average left is 21/2; 5 -> |21-10|=11, 5+3 -> |21-16|=5,
        # 5+3+8 -> |21-32|=11 is farther, so the first batch stops at two units.
        self.assertEqual(self.partition({"costs": [5, 3, 8, 1, 4], "swap_times": 2}),
                         {"sizes": [2, 3], "batch_costs": [8, 13]})
        # 10 1 1 1 1 10 in 3: the first batch takes 10 (|24-30| < |24-33|); the second grows while it
        # nears 14/2, up to the one unit the last batch must keep; the last takes the 10.
        self.assertEqual(self.partition({"costs": [10, 1, 1, 1, 1, 10], "swap_times": 3}),
                         {"sizes": [1, 4, 1], "batch_costs": [10, 4, 10]})
        # More batches than units: one unit each; zero costs count as 1 in the rule, 0 in the sums.
        self.assertEqual(self.partition({"costs": [0, 0, 0], "swap_times": 5}),
                         {"sizes": [1, 1, 1], "batch_costs": [0, 0, 0]})
        self.assertEqual(self.partition({"costs": [], "swap_times": 3}), {"sizes": [], "batch_costs": []})

    def test_split_policy(self):
        # 21 bytes in 2 batches: the first holds bytes [0, 11), cutting unit 2 after 3 of its 8.
        self.assertEqual(self.partition({"costs": [5, 3, 8, 1, 4], "swap_times": 2}, "--policy", "split"), {
            "sizes": [3, 3], "batch_costs": [11, 10],
            "batches": [[{"unit": 0, "begin": 0, "end": 5}, {"unit": 1, "begin": 0, "end": 3},
                         {"unit": 2, "begin": 0, "end": 3}],
                        [{"unit": 2, "begin": 3, "end": 8}, {"unit": 3, "begin": 0, "end": 1},
                         {"unit": 4, "begin": 0, "end": 4}]]})
        # Cuts on multiples of the granularity: the first batch ends at element 4 of unit 0.
        j = self.partition({"costs": [10], "swap_times": 3, "granularity": 4}, "--policy", "split")
        self.assertEqual(j["batches"], [[{"unit": 0, "begin": 0, "end": 4}], [{"unit": 0, "begin": 4, "end": 8}],
                                        [{"unit": 0, "begin": 8, "end": 10}]])

    def test_bad_input(self):
        for stdin, args, message in [
                ('{"costs": [1, 2], "swap_times": 0}', [], "swap_times must be positive (got 0)"),
                ('{"costs": [1, -2], "swap_times": 2}', [], "input: 'costs' element 1 must be a non-negative integer, got -2"),
                ('{"costs": [1, 2.5], "swap_times": 2}', [], "'costs' element 1 must be a non-negative integer, got 2.5"),
                ('{"swap_times": 2}', [], "input: missing 'costs'"),
                ('{"costs": [1]}', [], "input: missing 'swap_times'"),
                ('{"costs": 3, "swap_times": 1}', [], "input: 'costs' must be an array, got number"),
                ('{"costs": [1], "swap_times": 1, "k": 2}', [], "input: unknown key 'k'"),
                ('{"costs": [1], "swap_times": 1, "granularity": 2}', [], "unknown key 'granularity' (only with --policy split)"),
                ('{"costs": [1], "swap_times": 1, "granularity": 0}', ["--policy", "split"], "granularity must be positive"),
                ("[1, 2]", [], "input: expected an object"),
                ("", [], "malformed JSON")]:
            status, out, err = run("partition", *args, stdin=stdin)
            self.assertEqual(status, 2, stdin)
            self.assertEqual(out, "", stdin)
            self.assertIn(message, err, stdin)
            self.assertTrue(err.startswith("pipeswap partition: "), err)


class ScenarioFiles(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, data):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(data if isinstance(data, str) else json.dumps(data))
        return path

    def test_scenario_prints_every_field_and_reads_back(self):
        _, out, _ = run("scenario", check=0)
        j = json.loads(out)
        self.assertEqual(list(j), ["model", "device", "node", "parallel", "pipeline", "swap", "plan"])
        self.assertEqual(j["plan"], {"tolerance": 0.005})
        self.assertEqual(j["model"]["layers"], 80)
        self.assertEqual(j["device"]["memory_bytes"], 141_000_000_000)
        self.assertEqual(j["device"]["h2d_gbps"], 55)
        self.assertEqual(j["pipeline"], {"schedule": "1f1b", "ranks": 8, "micro_batches": 32, "stages_per_rank": 1,
                                         "overlap_b_f": False})
        path = self.write("full.json", out)
        _, again, _ = run("scenario", "--scenario", path, check=0)
        self.assertEqual(again, out)
        _, partial, _ = run("scenario", "--scenario", self.write("tiny.json", TINY), check=0)
        p = json.loads(partial)
        self.assertEqual(p["model"]["hidden"], 512)
        self.assertEqual(p["model"]["param_dtype"], "BF16")  # the default fills in
        self.assertEqual(p["device"]["h2d_gbps"], 55)

    def test_the_example_scenarios_read_and_keep_their_fields(self):
        # examples/scenarios/*.json: the other shapes of docs/performance.md.
        here = os.path.dirname(os.path.abspath(__file__))
        folder = os.path.join(here, "..", "..", "examples", "scenarios")
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
        self.assertEqual(names[:3], ["13b_interleaved.json", "7b_2ranks.json", "7b_2ranks_slow_link.json"])
        for n in names:
            with open(os.path.join(folder, n)) as f:
                given = json.load(f)
            _, out, _ = run("scenario", "--scenario", os.path.join(folder, n), check=0)
            full = json.loads(out)
            for section, fields in given.items():
                if section == "comment":
                    self.assertEqual(full["comment"], fields)
                    continue
                for key, value in fields.items():
                    if isinstance(value, dict):  # a nested section (model.moe): the given keys
                        for k2, v2 in value.items():
                            self.assertEqual(full[section][key][k2], v2, f"{n}: {section}.{key}.{k2}")
                    else:
                        self.assertEqual(full[section][key], value, f"{n}: {section}.{key}")

    def test_bad_scenarios_exit_2_naming_the_field(self):
        big_model = json.loads(json.dumps(TINY))
        big_model["device"]["memory_bytes"] = 20_000_000
        cases = [
            ({"model": {"layrs": 3}}, "scenario: model: unknown key 'layrs' (did you mean 'layers'?)"),
            ({"device": {"memory_bytes": -5}}, "scenario: device.memory_bytes: must not be negative, got -5"),
            ({"pipeline": {"ranks": 0}}, "scenario: pipeline.ranks must be at least 1"),
            ({"swap": {"swap_times": 1.5}}, "scenario: swap.swap_times: must be an integer, got 1.5"),
            (big_model, "scenario: device.memory_bytes (20000000) cannot fit rank 0 whatever is swapped"),
            ('{"model": }', "scenario: malformed JSON at byte 11"),
        ]
        for data, message in cases:
            path = self.write("bad.json", data)
            for sub in ("simulate", "plan", "scenario"):
                status, out, err = run(sub, "--scenario", path)
                self.assertEqual(status, 2, (sub, data))
                self.assertEqual(out, "", (sub, data))
                self.assertTrue(err.startswith(f"pipeswap {sub}: {path}: {message}"), err)
        status, _, err = run("simulate", "--scenario", os.path.join(self.dir.name, "missing.json"))
        self.assertEqual(status, 2)
        self.assertIn("cannot open", err)
        status, _, err = run("simulate", "--scenario", "-", stdin='{"modle": {}}')
        self.assertEqual(status, 2)
        self.assertIn("pipeswap simulate: <stdin>: scenario: top level: unknown key 'modle'", err)


def parse_svg(path):
    root = ET.parse(path).getroot()  # raises on anything that is not well-formed XML
    return root


class Simulate(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.scenario = os.path.join(cls.dir.name, "tiny.json")
        with open(cls.scenario, "w") as f:
            json.dump(TINY, f)
        cls.trace = os.path.join(cls.dir.name, "trace.json")
        cls.svg = os.path.join(cls.dir.name, "memory.svg")
        _, out, err = run("simulate", "--scenario", cls.scenario, "--trace", cls.trace, "--svg", cls.svg, "--json",
                          check=0)
        cls.report = json.loads(out)
        cls.stderr = err

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_report_has_the_four_configurations_for_every_rank(self):
        r = self.report
        self.assertEqual(self.stderr, "")  # no progress without a terminal
        self.assertEqual(r["scenario"]["model"]["name"], "tiny")
        names = [c["name"] for c in r["configurations"]]
        self.assertEqual(names, ["none", "activations", "optimizer", "both"])
        self.assertEqual([c["title"] for c in r["configurations"]],
                         ["no swap", "activation swap", "optimizer swap", "both"])
        memory = TINY["device"]["memory_bytes"]
        base = r["configurations"][0]
        for c in r["configurations"]:
            ranks = c["ranks"]
            self.assertEqual([x["rank"] for x in ranks], [0, 1, 2, 3])
            self.assertEqual(c["peak_bytes"], max(x["peak_bytes"] for x in ranks))
            self.assertEqual(c["peak_bytes"], ranks[c["peak_rank"]]["peak_bytes"])
            self.assertEqual(c["step_ns"], max(x["step_ns"] for x in ranks))
            self.assertEqual(c["h2d_bytes"], sum(x["h2d_bytes"] for x in ranks))
            self.assertEqual(c["d2h_bytes"], sum(x["d2h_bytes"] for x in ranks))
            self.assertEqual(c["fits"], all(x["fits"] for x in ranks))
            self.assertAlmostEqual(c["overhead"], (c["step_ns"] - base["step_ns"]) / base["step_ns"])
            for x, b in zip(ranks, base["ranks"]):
                self.assertEqual(x["fits"], x["peak_bytes"] <= memory, (c["name"], x["rank"]))
                self.assertAlmostEqual(x["overhead"], (x["step_ns"] - b["step_ns"]) / b["step_ns"])
                self.assertGreaterEqual(x["step_ns"], x["pipeline_ns"])
                self.assertEqual(x["resident_param_bytes"], b["resident_param_bytes"])
                self.assertEqual(x["optimizer_state_bytes"], b["optimizer_state_bytes"])
        self.assertEqual(base["h2d_bytes"], 0)  # nothing moves without swap
        self.assertEqual(base["d2h_bytes"], 0)
        by = {c["name"]: c for c in r["configurations"]}
        # Swapping lowers the peak of every rank, both at least as much as either alone.
        for k in range(4):
            peak = {n: by[n]["ranks"][k]["peak_bytes"] for n in by}
            self.assertLessEqual(peak["optimizer"], peak["none"])
            self.assertLessEqual(peak["activations"], peak["none"])
            self.assertLessEqual(peak["both"], min(peak["optimizer"], peak["activations"]))
        # Per rank: BF16 weights and FP32 gradients (6 bytes per parameter), AdamW state with fp32
        # master (12). Optimizer swap moves the state to the device and back once per step, except that
        # of the tensors under 1024 elements (the norms), which stays on the device.
        for k in range(4):
            params, small = rank_params(TINY["model"], 4, k)
            self.assertEqual(base["ranks"][k]["resident_param_bytes"], 6 * params)
            self.assertEqual(base["ranks"][k]["optimizer_state_bytes"], 12 * params)
            for name in ("optimizer", "both"):
                x = by[name]["ranks"][k]
                moved = 12 * (params - small)
                if name == "optimizer":
                    self.assertEqual(x["h2d_bytes"], moved)
                    self.assertEqual(x["d2h_bytes"], moved)
            self.assertEqual(by["activations"]["ranks"][k]["h2d_bytes"], by["activations"]["ranks"][k]["d2h_bytes"])
            self.assertEqual(by["both"]["ranks"][k]["h2d_bytes"],
                             by["activations"]["ranks"][k]["h2d_bytes"] + by["optimizer"]["ranks"][k]["h2d_bytes"])
        self.assertEqual(r["files"], {"trace": self.trace, "svg": self.svg, "svg_rank": by["none"]["peak_rank"]})

    def test_trace_is_chrome_trace_json(self):
        with open(self.trace) as f:
            t = json.load(f)
        events = t["traceEvents"]
        self.assertGreater(len(events), 0)
        both = self.report["configurations"][3]
        reserved = TINY["device"]["reserved_bytes"]
        micro = TINY["pipeline"]["micro_batches"]
        processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
        self.assertEqual(sorted(processes.values()), ["rank 0", "rank 1", "rank 2", "rank 3"])
        # The step starts at a common time T0, when every rank has finished its setup: the ranks that
        # finished earlier wait for it.
        waits = [e["ts"] + e["dur"] for e in events if e.get("name") == "wait for the other ranks"]
        self.assertGreater(len(waits), 0)
        self.assertAlmostEqual(min(waits), max(waits), delta=0.002)
        t0 = max(waits)
        for pid, name in processes.items():
            rank = int(name.split()[1])
            mine = [e for e in events if e["pid"] == pid and e["ph"] != "M"]
            for e in mine:
                self.assertIn(e["ph"], ("X", "i", "C"))
                self.assertIsInstance(e["ts"], (int, float))
                self.assertGreaterEqual(e["ts"], 0)
                if e["ph"] == "X":
                    self.assertGreaterEqual(e["dur"], 0)
            # Every forward and backward of the rank's stage, as kernels.
            names = {e["name"] for e in mine if e["ph"] == "X"}
            for m in range(micro):
                self.assertIn(f"FWD s{rank} m{m}", names)
                self.assertIn(f"BWD s{rank} m{m}", names)
            # The rank's step ends with its last event, step_ns after T0 (trace times are microseconds).
            end = max(e["ts"] + e.get("dur", 0) for e in mine)
            self.assertAlmostEqual(end - t0, both["ranks"][rank]["step_ns"] / 1e3, delta=0.01)
            # The device-bytes counter over the step peaks at the reported peak, less the reserved bytes.
            counter = sorted(((e["ts"], e["args"]["bytes"]) for e in mine if e["ph"] == "C"), key=lambda c: c[0])
            at_t0 = [b for ts, b in counter if ts <= t0][-1]
            during = [b for ts, b in counter if ts > t0]
            self.assertEqual(max([at_t0] + during) + reserved, both["ranks"][rank]["peak_bytes"])

    def test_svg_has_a_series_per_configuration_and_the_capacity(self):
        root = parse_svg(self.svg)
        self.assertEqual(root.tag, SVG_NS + "svg")
        rank = self.report["files"]["svg_rank"]
        title = root.find(SVG_NS + "title").text
        self.assertIn(f"rank {rank}", title)
        groups = [g for g in root.iter(SVG_NS + "g") if g.find(SVG_NS + "title") is not None]
        series = [g for g in groups if g.find(SVG_NS + "path") is not None]
        levels = [g for g in groups if g.find(SVG_NS + "line") is not None]
        self.assertEqual(len(series), 4)
        for g, c in zip(series, self.report["configurations"]):
            name = g.find(SVG_NS + "title").text
            peak_gb = c["ranks"][rank]["peak_bytes"] / 1e9
            self.assertEqual(name, f"{c['title']} (peak {peak_gb:.1f} GB)")
            d = g.find(SVG_NS + "path").get("d")
            self.assertRegex(d, r"^M[\d.]+ [\d.]+( [HV][\d.]+)*$")
        self.assertEqual(len(levels), 1)
        self.assertEqual(levels[0].find(SVG_NS + "title").text, "device capacity 0.1 GB")
        texts = [t.text for t in root.iter(SVG_NS + "text")]
        self.assertIn("time (s)", texts)
        self.assertIn("device memory (GB)", texts)
        for el in root.iter():
            for k, v in el.attrib.items():
                self.assertNotIn("href", k)
                self.assertNotIn("url(", v)

    def test_table_output(self):
        _, out, err = run("simulate", "--scenario", self.scenario, "--trace", "", "--svg", "", check=0)
        self.assertEqual(err, "")
        self.assertIn("scenario: tiny (8 layers,", out)
        for title in ("no swap", "activation swap", "optimizer swap", "both"):
            self.assertEqual(len(re.findall(rf"^\S*\s*{title}\s", out, re.M)), 5, title)  # summary + 4 ranks
        self.assertNotIn("trace of", out)  # no files asked for, none written
        self.assertNotIn("memory chart", out)

    def test_rank_option_and_progress(self):
        svg = os.path.join(self.dir.name, "rank3.svg")
        _, out, err = run("simulate", "--scenario", self.scenario, "--trace", "", "--svg", svg, "--rank", "3",
                          "--progress", "always", check=0)
        self.assertIn(f"memory chart of rank 3: {svg}", out)
        self.assertIn("rank 3", parse_svg(svg).find(SVG_NS + "title").text)
        lines = err.splitlines()
        self.assertGreater(len(lines), 0)
        self.assertTrue(all(re.fullmatch(r"pipeswap simulate: \d+%", l) for l in lines), err)
        self.assertEqual(lines[-1], "pipeswap simulate: 100%")
        pcts = [int(l.split()[-1][:-1]) for l in lines]
        self.assertEqual(pcts, sorted(pcts))
        status, out, err = run("simulate", "--scenario", self.scenario, "--rank", "4")
        self.assertEqual(status, 2)
        self.assertEqual(err, "pipeswap simulate: --rank 4 is not a rank of the scenario (it has 4)\n")

    def test_unwritable_output_exits_2(self):
        status, _, err = run("simulate", "--scenario", self.scenario, "--svg", "",
                             "--trace", os.path.join(self.dir.name, "no", "such", "dir", "t.json"))
        self.assertEqual(status, 2)
        self.assertIn("cannot write", err)


class MegatronArguments(unittest.TestCase):
    """`pipeswap scenario --megatron`: a Megatron-LM job's arguments as a scenario
    (sim/megatron_args.hpp; tests/sim/megatron_args_test.cpp holds the mapping)."""

    ARGS = ("torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py --num-layers 8 --hidden-size 1024 "
            "--num-attention-heads 8 --seq-length 2048 --vocab-size 32000 --bf16 --swiglu "
            "--tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 2 "
            "--global-batch-size 64 --use-distributed-optimizer --lr 3e-4")

    def test_the_arguments_become_a_scenario_that_simulates(self):
        _, out, err = run("scenario", "--megatron", "-", "--device", "B200", "--name", "small", stdin=self.ARGS,
                          check=0)
        s = json.loads(out)
        self.assertEqual(s["model"]["name"], "small")
        self.assertEqual(s["device"]["name"], "B200")
        self.assertEqual((s["parallel"]["tp"], s["parallel"]["dp"], s["pipeline"]["ranks"]), (2, 4, 2))
        self.assertEqual(s["pipeline"]["micro_batches"], 16)  # 64 / (1 × 4)
        self.assertTrue(s["comment"].startswith("From Megatron-LM arguments (pipeswap scenario --megatron) on 16 GPUs"))
        self.assertIn("pipeswap scenario: note: not read by the simulator: --lr\n", err)
        # the scenario reads back and simulates
        rc, sim_out, _ = run("simulate", "--scenario", "-", "--trace", "", "--svg", "", stdin=out)
        self.assertEqual(rc, 0)
        self.assertIn("small", sim_out)

    def test_bad_arguments_name_the_flag_and_exit_2(self):
        rc, out, err = run("scenario", "--megatron", "-", stdin=self.ARGS + " --context-parallel-size 2")
        self.assertEqual((rc, out), (2, ""))
        self.assertIn("megatron arguments: --context-parallel-size: context parallelism is not modelled", err)
        rc, _, err = run("scenario", "--megatron", "-", stdin=self.ARGS.replace("--nnodes 2", "--nnodes 3"))
        self.assertEqual(rc, 2)
        self.assertIn("--global-batch-size: 64 is not a multiple of --micro-batch-size × the data-parallel "
                      "degree (1 × 6)", err)
        # the launch options belong to --megatron, which excludes --scenario
        rc, _, err = run("scenario", "--gpus", "8")
        self.assertEqual(rc, 2)
        self.assertIn("--gpus requires --megatron", err)
        self.assertNotEqual(run("scenario", "--megatron", "-", "--scenario", "-", stdin=self.ARGS)[0], 0)


class DefaultScenario(unittest.TestCase):
    """The built-in scenario's report against numbers worked out by hand from docs/simulator.md."""

    @classmethod
    def setUpClass(cls):
        _, out, _ = run("simulate", "--json", "--trace", "", "--svg", "", check=0)
        cls.report = json.loads(out)
        cls.by = {c["name"]: c for c in cls.report["configurations"]}

    def test_it_is_the_documented_scenario(self):
        s = self.report["scenario"]
        self.assertEqual((s["model"]["layers"], s["model"]["hidden"], s["model"]["ffn_hidden"]), (80, 8192, 28672))
        self.assertEqual((s["pipeline"]["schedule"], s["pipeline"]["ranks"], s["pipeline"]["micro_batches"]),
                         ("1f1b", 8, 32))
        self.assertEqual(s["device"]["memory_bytes"], 141_000_000_000)

    def test_swap_makes_it_fit(self):
        self.assertFalse(self.by["none"]["fits"])
        self.assertTrue(self.by["both"]["fits"])
        self.assertTrue(all(not x["fits"] for x in self.by["none"]["ranks"][:2]))
        self.assertTrue(all(x["fits"] for x in self.by["both"]["ranks"]))
        self.assertGreater(self.by["both"]["overhead"], 0)

    def test_rank_0_by_hand(self):
        # Rank 0 holds the embedding (32000 x 8192) and layers 0-9. A layer: q, o 8192^2 each; k, v
        # 8192 x 1024 each (8 of 64 heads); gate, up, down 8192 x 28672 each; two norms of 8192:
        # 134217728 + 16777216 + 704643072 + 16384 = 855654400 parameters.
        layer = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
        self.assertEqual(layer, 855_654_400)
        p0 = 32000 * 8192 + 10 * layer
        self.assertEqual(p0, 8_818_688_000)
        none = self.by["none"]["ranks"][0]
        # BF16 weights and FP32 gradients: 2 + 4 bytes per parameter; AdamW with fp32 master, exp_avg
        # and exp_avg_sq: 12 bytes per parameter (18 in all, Megatron-LM's distributed optimizer table).
        self.assertEqual(none["resident_param_bytes"], 6 * p0)       # 52.91 GB
        self.assertEqual(none["optimizer_state_bytes"], 12 * p0)     # 105.8 GB
        # Optimizer swap moves every state byte (no tensor of rank 0 is under 1024 elements) to the
        # device and back once per step.
        opt = self.by["optimizer"]["ranks"][0]
        self.assertEqual(opt["h2d_bytes"], 12 * p0)
        self.assertEqual(opt["d2h_bytes"], 12 * p0)

    def test_peak_without_swap_follows_the_formula(self):
        # Saved activations per layer and micro-batch (docs/simulator.md, "Activations"), T = 4096
        # tokens, h = 8192, f = 28672, kv = 1024, 2-byte elements: the two norms' inputs and the two
        # matmul inputs after them (4 x 2Th), Q and the flash output (2 x 2Th), K and V (2 x 2T kv),
        # the fp32 log-sum-exp (4 x 64 heads x T), SwiGLU's gate and up outputs (2 x 2Tf) and down's
        # input (2Tf). A stage saves its 10 layers' and its input (2Th); the last stage also the final
        # norm's and the head's inputs (2 x 2Th) and the fp32 softmax of the logits (4 x T x 32000).
        T, h, f = 4096, 8192, 28672
        boundary = 2 * T * h
        per_layer = 6 * 2 * T * h + 2 * 2 * T * 1024 + 4 * 64 * T + 3 * 2 * T * f
        self.assertEqual(per_layer, 1_125_122_048)
        head = 2 * 2 * T * h + 4 * T * 32000
        for r, x in enumerate(self.by["none"]["ranks"]):
            params, _ = rank_params(self.report["scenario"]["model"], 8, r)
            stage = 10 * per_layer + boundary + (head if r == 7 else 0)
            # Without swap, 1F1B keeps min(R - r, M) micro-batches in flight on rank r, and at most
            # four boundary-sized buffers are in transit (input, output, gradient in and out).
            base = 6_000_000_000 + 18 * params + min(8 - r, 32) * stage
            self.assertGreaterEqual(x["peak_bytes"], base, r)
            self.assertLessEqual(x["peak_bytes"], base + 4 * boundary, r)
        # Rank 0: 6 GB + 18 x 8.8187 GB + 8 x 11.3183 GB = 255.3 GB, against 141 GB.
        self.assertAlmostEqual(self.by["none"]["ranks"][0]["peak_bytes"] / 1e9, 255.3, delta=0.3)

    def test_the_node_shares_its_host_bandwidth(self):
        # The eight ranks are the eight devices of one node: copying at once, each gets 278 / 8 GB/s,
        # and 0.7 of that while both directions run.
        for x in self.by["optimizer"]["ranks"]:
            self.assertEqual(x["link_sharing"], 8)
            self.assertAlmostEqual(x["h2d_gbps"], 278 / 8 * 0.7, places=9)
        # Activation swap: ranks 6 and 7 have no eligible group, so six devices share the node.
        for x in self.by["activations"]["ranks"][:6]:
            self.assertEqual(x["link_sharing"], 6)
            self.assertAlmostEqual(x["h2d_gbps"], 278 / 6 * 0.7, places=9)


# A 70B-class job on 128 devices: tp 8 with sequence parallelism, pp 4, dp 4 with the distributed
# optimizer, 16 micro-batches. docs/simulator.md, "A multi-parallel job by hand", computes rank 0.
MULTI = {
    "parallel": {"tp": 8, "sequence_parallel": True, "dp": 4, "distributed_optimizer": True},
    "pipeline": {"ranks": 4, "micro_batches": 16},
    "swap": {"overlap": False},  # the reference step: the hand computations below
}


class Overlap(unittest.TestCase):
    """swap.overlap through the command: the field is read and reported, and a configuration that
    fits without overlap still fits with it, at no more step time for the optimizer swap."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.reports = {}
        for overlap in (False, True):
            scenario = json.loads(json.dumps(TINY))
            scenario["swap"]["overlap"] = overlap
            path = os.path.join(cls.dir.name, f"overlap_{overlap}.json")
            with open(path, "w") as f:
                json.dump(scenario, f)
            _, out, _ = run("simulate", "--scenario", path, "--json", "--trace", "", "--svg", "", check=0)
            cls.reports[overlap] = json.loads(out)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_the_field_is_read_and_reported(self):
        for overlap, r in self.reports.items():
            self.assertIs(r["scenario"]["swap"]["overlap"], overlap)
            self.assertTrue(all(c["overlap"] is overlap for c in r["configurations"]))
        _, out, _ = run("scenario", check=0)
        self.assertIs(json.loads(out)["swap"]["overlap"], True)  # the default

    def test_what_fits_without_overlap_fits_with_it(self):
        off = {c["name"]: c for c in self.reports[False]["configurations"]}
        on = {c["name"]: c for c in self.reports[True]["configurations"]}
        for name in off:
            if off[name]["fits"]:
                self.assertTrue(on[name]["fits"], name)
        self.assertEqual(on["none"]["step_ns"], off["none"]["step_ns"])
        self.assertLessEqual(on["optimizer"]["overhead"], off["optimizer"]["overhead"])
        for x in on["optimizer"]["ranks"]:
            # 0: the rank's phases were turned off to keep it within the device (simulate_sized).
            self.assertIn(x["optimizer_batches"], (0, TINY["swap"]["swap_times"]))
            self.assertLessEqual(x["prefetched_batches"], x["optimizer_batches"])
            self.assertLessEqual(x["resident_share_bytes"], x["optimizer_state_bytes"])
        for x in off["optimizer"]["ranks"]:
            self.assertEqual((x["prefetched_batches"], x["resident_share_bytes"]), (0, 0))

    def test_bad_overlap_values_exit_2(self):
        path = os.path.join(self.dir.name, "bad.json")
        with open(path, "w") as f:
            json.dump({"swap": {"overlap": "yes"}}, f)
        status, out, err = run("simulate", "--scenario", path)
        self.assertEqual(status, 2)
        self.assertEqual(out, "")
        self.assertIn('scenario: swap.overlap: expected true or false, got string "yes"', err)


class MultiParallelScenario(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        path = os.path.join(cls.dir.name, "multi.json")
        with open(path, "w") as f:
            json.dump(MULTI, f)
        _, out, _ = run("simulate", "--scenario", path, "--json", "--trace", "", "--svg", "", check=0)
        cls.report = json.loads(out)
        cls.by = {c["name"]: c for c in cls.report["configurations"]}

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_rank_0_by_hand(self):
        self.assertFalse(self.report["scenario"]["swap"]["overlap"])  # the reference step
        T, h, f, kv, t, d = 4096, 8192, 28672, 1024, 8, 4
        # Per device of the tp group: every matrix split by 8, the norms whole; the embedding's
        # vocabulary split by 8. 20 layers on rank 0.
        layer = (2 * h * h + 2 * h * kv + 3 * h * f) // t + 2 * h
        self.assertEqual(layer, 106_971_136)
        p0 = 32000 // t * h + 20 * layer
        self.assertEqual(p0, 2_172_190_720)
        none = self.by["none"]["ranks"][0]
        self.assertEqual(none["resident_param_bytes"], 6 * p0)       # BF16 weights, FP32 gradients
        self.assertEqual(none["optimizer_state_bytes"], 12 * p0 // d)  # 12/d: the distributed optimizer
        # Optimizer swap moves only the shard (every shard is at least 1024 elements).
        opt = self.by["optimizer"]["ranks"][0]
        self.assertEqual(opt["h2d_bytes"], 12 * p0 // d)
        self.assertEqual(opt["d2h_bytes"], 12 * p0 // d)
        # Activations per layer with sequence parallelism: what is replicated without it (the norms'
        # and matmuls' inputs, 4 x 2Th) is split along the sequence; the rest by the heads or f.
        per_layer = (4 * 2 * T * h + 2 * 2 * T * h + 2 * 2 * T * kv + 3 * 2 * T * f) // t + 4 * (64 // t) * T
        self.assertEqual(per_layer, 140_640_256)
        boundary = 2 * T * h // t
        stage = 20 * per_layer + boundary
        base = 6_000_000_000 + 6 * p0 + 12 * p0 // d + min(4, 16) * stage
        self.assertGreaterEqual(none["peak_bytes"], base)
        self.assertLessEqual(none["peak_bytes"], base + 4 * boundary)
        self.assertAlmostEqual(none["peak_bytes"] / 1e9, 36.9, delta=0.1)
        self.assertTrue(self.by["none"]["fits"])

    def test_collectives_by_hand(self):
        # The data-parallel group has one device on each of 4 nodes (tp = 8 = node.gpus): one NIC, 40
        # GB/s bus bandwidth. Gradient reduce-scatter of 4 bytes x p0 and weight all-gather of 2 bytes x
        # p0, (d - 1)/d of the bytes each, plus the network's 15 us: 162.9 ms and 81.5 ms.
        p0 = 2_172_190_720
        rs = round(15e3 + 0.75 * 4 * p0 / 40e9 * 1e9)
        ag = round(15e3 + 0.75 * 2 * p0 / 40e9 * 1e9)
        self.assertEqual((rs, ag), (162_929_304, 81_472_152))
        # Overlapped (the defaults): 55 buckets of 40 M parameters; at least the last bucket of each
        # is exposed after the pipeline, never all of both.
        buckets = -(-p0 // 40_000_000)
        self.assertEqual(buckets, 55)
        none = self.by["none"]["ranks"][0]
        after = none["step_ns"] - none["pipeline_ns"]
        self.assertGreater(after, rs // buckets + ag // buckets)
        self.assertLess(after, rs + ag)
        # MFU is end to end: below the GEMM ceiling (0.58) by the smaller kernels, the bubble and the
        # collectives (docs/simulator.md: 41.4 %).
        self.assertAlmostEqual(self.by["none"]["mfu"], 0.414, delta=0.001)
        self.assertEqual(none["pipeline_ns"], 2_084_546_906)


class Plan(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.scenario = os.path.join(cls.dir.name, "tiny.json")
        with open(cls.scenario, "w") as f:
            json.dump(TINY, f)
        _, out, _ = run("simulate", "--scenario", cls.scenario, "--json", "--trace", "", "--svg", "", check=0)
        cls.report = json.loads(out)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_plan_fits_the_budget(self):
        none, both = self.report["configurations"][0], self.report["configurations"][3]
        budget = (none["peak_bytes"] + both["peak_bytes"]) / 2
        _, out, err = run("plan", "--scenario", self.scenario, "--budget", f"{budget / 1e9:.9f}", "--json", check=0)
        self.assertEqual(err, "")
        j = json.loads(out)
        self.assertTrue(j["fits"])
        self.assertEqual(j["budget_bytes"], round(budget))
        chosen = j["chosen"]
        self.assertLessEqual(chosen["outcome"]["peak_bytes"], budget)
        self.assertEqual(j["baseline"]["peak_bytes"], none["peak_bytes"])
        self.assertEqual(j["baseline"]["step_ns"], none["step_ns"])
        # Nothing simulated that fits is faster than the choice.
        for c in j["simulated"]:
            if c["fits"]:
                self.assertGreaterEqual(c["outcome"]["step_ns"], chosen["outcome"]["step_ns"])
        self.assertEqual(sum(c["verdict"] == "chosen" for c in j["simulated"]), 1)
        _, text, _ = run("plan", "--scenario", self.scenario, "--budget", f"{budget / 1e9:.9f}", check=0)
        self.assertIn("chosen: " + chosen["description"] + "\n", text)
        self.assertIn("against no swap", text)

    def test_nothing_fits_exits_1(self):
        status, out, err = run("plan", "--scenario", self.scenario, "--budget", "0.001")
        self.assertEqual(status, 1)
        self.assertIn("nothing fits the budget of 0.0 GB.", out)
        self.assertEqual(err, "pipeswap plan: nothing fits the budget of 0.0 GB\n")
        status, out, _ = run("plan", "--scenario", self.scenario, "--budget", "0.001", "--json")
        self.assertEqual(status, 1)
        j = json.loads(out)
        self.assertFalse(j["fits"])
        self.assertIsNone(j["chosen"])


SCENARIOS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scenarios")


class HonestPlanner(unittest.TestCase):
    """The planner scenarios of issue #22: ties within the tolerance go to the fewest host-link bytes,
    then the lowest peak; every verdict says what its numbers say; a change to the user's own
    settings is printed as one."""

    def plan(self, name, *extra):
        _, out, _ = run("plan", "--scenario", os.path.join(SCENARIOS, name), "--json", *extra, check=0)
        return json.loads(out)

    def test_8b_the_chosen_plan_moves_the_fewest_bytes_of_the_equally_fast(self):
        j = self.plan("llama3_8b_pp4_h100.json")
        self.assertEqual(j["tolerance"], 0.005)
        chosen = j["chosen"]["outcome"]
        moved = lambda o: o["h2d_bytes"] + o["d2h_bytes"]
        fitting = [c for c in j["simulated"] if c["fits"]]
        fastest = min(c["outcome"]["step_ns"] for c in fitting)
        self.assertLessEqual(chosen["step_ns"], fastest * 1.005)
        within = [c for c in fitting if c["outcome"]["step_ns"] <= fastest * 1.005]
        self.assertGreater(len(within), 1)
        for c in within:
            self.assertLessEqual(moved(chosen), moved(c["outcome"]), c["description"])
            if c["verdict"] != "chosen":
                self.assertIn("within the 0.50 % tolerance", c["verdict"])
        for c in fitting:
            if c["outcome"]["step_ns"] > fastest * 1.005:
                self.assertIn("slower than the chosen plan (beyond the 0.50 % tolerance)", c["verdict"])
        # It swaps optimizer state only: tens of GB (54.5 GB in the steady state with the per-operation
        # compute model, 36.0 GB at the old single efficiency, whose longer steps left room for larger
        # resident shares), where every eligible activation group moves hundreds.
        self.assertEqual(chosen["swapped_chunks"], 0)
        self.assertLess(moved(chosen), 60e9)
        self.assertEqual(j["chosen"]["changes"], [])

    def test_tolerance_comes_from_the_scenario_or_the_option(self):
        self.assertEqual(self.plan("llama3_8b_pp4_h100.json", "--tolerance", "0")["tolerance"], 0)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.json")
            with open(path, "w") as f:
                json.dump({"plan": {"tolerance": 0.02}, **TINY}, f)
            _, out, _ = run("plan", "--scenario", path, "--json", check=0)
            self.assertEqual(json.loads(out)["tolerance"], 0.02)
            with open(path, "w") as f:
                json.dump({"plan": {"tolerance": 1.5}}, f)
            status, _, err = run("plan", "--scenario", path)
            self.assertEqual(status, 2)
            self.assertIn("plan.tolerance must be in [0, 1)", err)
        status, _, err = run("plan", "--tolerance", "-1")
        self.assertEqual(status, 2)

    def test_70b_plan_prints_the_change_of_recomputation(self):
        j = self.plan("70b_tp8_pp4_full_recompute.json")
        self.assertEqual(j["chosen"]["recompute"], "none")
        self.assertEqual(j["chosen"]["changes"], [{"field": "model.recompute", "from": "full", "to": "none"}])
        _, text, _ = run("plan", "--scenario", os.path.join(SCENARIOS, "70b_tp8_pp4_full_recompute.json"), check=0)
        self.assertIn("  changes your setting model.recompute: full -> none\n", text)


GALLERY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "scenarios")
GALLERY_FILES = ["llama3_70b_64xh100.json", "llama31_405b_first_stages_1f1b.json",
                 "llama31_405b_first_stages_interleaved.json", "qwen3_30b_a3b_16xh100.json",
                 "llama3_70b_full_finetune_8xh200.json"]


class Gallery(unittest.TestCase):
    """The published deployments of examples/scenarios: each names its source, simulates and plans;
    the verdict is never beaten on both step time (beyond the tolerance) and peak; where the source
    publishes throughput the simulator is checked against it (docs/simulator.md, "The gallery")."""

    @classmethod
    def setUpClass(cls):
        cls.plans = {}
        for n in GALLERY_FILES:
            _, out, _ = run("plan", "--scenario", os.path.join(GALLERY, n), "--json", check=0)
            cls.plans[n] = json.loads(out)

    def test_every_file_cites_its_source(self):
        for n in GALLERY_FILES:
            with open(os.path.join(GALLERY, n)) as f:
                given = json.load(f)
            self.assertGreater(len(given.get("comment", "")), 80, n)

    def test_the_verdict_is_never_beaten_on_both_step_and_peak(self):
        for n, j in self.plans.items():
            v, alts, tol = j["verdict"], j["alternatives"], j["tolerance"]
            self.assertTrue(v["text"].startswith("verdict: "), n)
            self.assertIsNotNone(v["choice"], n)
            chosen = next(a for a in alts if a["key"] == v["choice"])
            self.assertTrue(chosen["fits"], n)
            for a in alts:
                faster = a["step_ns"] * (1 + tol) < chosen["step_ns"]
                self.assertFalse(faster and a["peak_bytes"] < chosen["peak_bytes"], f"{n}: {a['title']}")
                if a["fits"]:
                    self.assertFalse(faster, f"{n}: {a['title']}")
            keys = [a["key"] for a in alts]
            for k in ("none", "optimizer_swap", "cpu_offload_25", "cpu_offload_100"):
                self.assertIn(k, keys, n)
            self.assertEqual(len(alts[0]["ranks"]), len(j["chosen"]["overlap"]), n)  # one entry per rank

    def test_405b_interleaved_gain_against_torchtitan(self):
        # torchtitan Table 5: 100 (1F1B) and 128 (interleaved 1F1B) tokens/s per GPU; 256 sequences of
        # 8192 tokens per step on 512 GPUs. The gallery's BF16 files give the interleaved gain within
        # 20 % of the published 1.28 and are faster than the published run; the throughput itself is
        # compared in Calibration, on the layout and FP8 the run used (held out).
        tps = {}
        for n, published in (("llama31_405b_first_stages_1f1b.json", 100), ("llama31_405b_first_stages_interleaved.json", 128)):
            _, out, _ = run("simulate", "--scenario", os.path.join(GALLERY, n), "--json", "--trace", "", "--svg", "", check=0)
            step = json.loads(out)["configurations"][0]["step_ns"] / 1e9
            tps[n] = 256 * 8192 / 512 / step
            self.assertGreater(tps[n], published, f"{n}: {tps[n]:.1f} tokens/s per GPU")
        gain = tps["llama31_405b_first_stages_interleaved.json"] / tps["llama31_405b_first_stages_1f1b.json"]
        self.assertLess(abs(gain - 1.28), 0.2 * 1.28, f"interleaved gain {gain:.3f}")

    def test_plan_draws_the_alternatives(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "alt.svg")
            _, text, _ = run("plan", "--scenario", os.path.join(SCENARIOS, "llama3_8b_pp4_h100.json"), "--svg", path, check=0)
            self.assertIn("alternatives chart: " + path, text)
            with open(path) as f:
                svg = f.read()
            # A point and a legend entry per alternative the text lists: ten, and the plan in a row of
            # its own when it is none of them (here optimizer swap per tensor in 4 batches, against the
            # optimizer swap alternative's packed 16).
            table = text.split("alternatives (", 1)[1].split("per rank (", 1)[0].splitlines()[2:]
            own_row = sum(1 for line in table if line.startswith("* the plan"))
            self.assertEqual(own_row, 1)
            self.assertEqual(len(table), 11)
            self.assertEqual(svg.count("<circle"), 2 * len(table))
            self.assertIn("budget 80.0 GB", svg)


CALIBRATION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "calibration")


class Calibration(unittest.TestCase):
    """The published runs of examples/calibration against the bands docs/simulator.md ("Calibration")
    states: predicted / published tokens/s per GPU of the no-swap step, M*b*s / (step * ranks * tp)."""

    @classmethod
    def setUpClass(cls):
        # The ratios as scripts/calibration.py computes and prints them for the docs' table.
        scripts = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
        sys.path.insert(0, scripts)
        try:
            import calibration
        finally:
            sys.path.remove(scripts)
        cls.script = calibration  # scripts/calibration.py
        # Each file simulated once: its scenario and no-swap configuration, and the throughput ratio.
        cls.runs = {n: calibration.simulate(PIPESWAP, os.path.join(CALIBRATION, n))
                    for n in sorted(os.listdir(CALIBRATION)) if n.endswith(".json")}
        cls.ratios = {}  # the files with a published throughput (the others check memory only)
        for n, result in cls.runs.items():
            predicted, published, _ = calibration.throughput(*result)
            if published is not None:
                cls.ratios[n] = predicted / published
        # the error each kind of model is given: the built-in scenario's (dense), a MoE file's and the
        # B200 MoE run's (the B200 preset's own band), by (kind, device)
        cls.stated = {}
        for scenario in (None, os.path.join(GALLERY, "qwen3_30b_a3b_16xh100.json"),
                         os.path.join(CALIBRATION, "bridge2602_qwen3_30b_a3b_8xb200.json")):
            _, out, _ = run("simulate", "--json", "--trace", "", "--svg", "", *(("--scenario", scenario) if scenario else ()))
            e = json.loads(out)["model_error"]
            cls.stated[(e["held_out_kind"], e["held_out_device"])] = e

    def held_out(self, stack=None, kind="dense"):
        return sorted(r for n, r in self.ratios.items()
                      if self.script.held_out(n) and (stack is None or self.script.stack(n) == stack)
                      and self.script.model_kind(self.runs[n][0]) == kind)

    def calibration(self, stack, kind="dense"):
        return sorted(r for n, r in self.ratios.items()
                      if not self.script.held_out(n) and (stack is None or self.script.stack(n) == stack)
                      and self.script.model_kind(self.runs[n][0]) == kind)

    def test_the_set_is_the_documented_one(self):
        self.assertEqual(len(self.runs), 40)
        self.assertEqual(len(self.ratios), 38)
        self.assertEqual(len(self.calibration("megatron")), 3)
        self.assertEqual(len(self.calibration("torchtitan")), 2)
        self.assertEqual(len(self.calibration(None, "mixture-of-experts")), 1)
        self.assertEqual(len(self.held_out("megatron")), 9)
        self.assertEqual(len(self.held_out("torchtitan")), 8)
        self.assertEqual(len(self.held_out("megatron", "mixture-of-experts")), 15)
        self.assertEqual(len(self.held_out(None, "mixture-of-experts")), 15)

    def test_the_calibration_runs_are_within_15_percent_at_their_stacks_fitted_ceiling(self):
        for stack in ("megatron", "torchtitan"):
            fit = self.calibration(stack)
            for r in fit:
                self.assertGreater(r, 0.85, stack)
                self.assertLess(r, 1.15, stack)
            # the ceiling is the fit: the geometric mean of the stack's calibration ratios is about 1
            self.assertAlmostEqual(math.exp(sum(math.log(r) for r in fit) / len(fit)), 1.0, delta=0.03, msg=stack)
        # the MoE host time (moe_host_layer_ms) is the fit of the one MoE calibration run, whose layer
        # the host bounds: without it the run is predicted over 3x too fast
        (r,) = self.calibration(None, "mixture-of-experts")
        self.assertAlmostEqual(r, 1.0, delta=0.03)
        name = "bridge2602_qwen3_30b_a3b_8xb200.json"
        predicted, published, _ = self.script.predict(PIPESWAP, os.path.join(CALIBRATION, name), None, 0.0)
        self.assertGreater(predicted / published, 3.0)

    def test_held_out_runs_are_within_the_stated_bands(self):
        # The project's targets on the dense runs: 15 % at the median of them all, which holds, and
        # 30 % on every held-out run, which holds on all but one: NeMo 25.02's Nemotron-4 15B on 64
        # B200s (1.37), a run of the early B200 software whose Llama 3 8B row the same table puts
        # at 1.22 and Megatron-Bridge's 25.11 at 1.04 on the same layout (docs/simulator.md). The
        # reports' dense band includes it. Each stack's median is held at 20 % (torchtitan's is 1.12).
        for stack in ("megatron", "torchtitan", None):
            held = self.held_out(stack)
            for r in held:
                self.assertGreater(r, 0.70, stack)
                self.assertLess(r, 1.40, stack)
            self.assertLess(abs(statistics.median(held) - 1), 0.15 if stack is None else 0.20, stack)
        outside = sorted(n for n, r in self.ratios.items() if self.script.held_out(n)
                         and self.script.model_kind(self.runs[n][0]) == "dense" and not 0.7 < r < 1.3)
        self.assertEqual(outside, ["heldout_nemo2502_nemotron4_15b_64xb200.json"])
        # The mixture-of-experts runs: twelve within ±30 %, their median 1.17, outside the ±15 % target;
        # three over-predicted by 1.4-2.1: 25.11's H100 Qwen3-30B-A3B run, whose software ran the
        # layout's next release 1.77x slower than its patch, and two B200 runs whose layers took
        # longer than the model's device and host times (docs/simulator.md): the targets do not hold
        # for them, and the reports say so with their own band. The median is held at 25 %.
        moe = self.held_out(None, "mixture-of-experts")
        for r in moe:
            self.assertGreater(r, 0.80)
            self.assertLess(r, 2.2)
        self.assertLess(abs(statistics.median(moe) - 1), 0.25)
        outside = sorted(n for n, r in self.ratios.items() if self.script.held_out(n)
                         and self.script.model_kind(self.runs[n][0]) == "mixture-of-experts" and not 0.7 < r < 1.3)
        self.assertEqual(outside, ["heldout_bridge2509_qwen3_30b_a3b_8xb200_tokendrop.json",
                                   "heldout_bridge2511_qwen3_235b_a22b_64xb200.json",
                                   "heldout_bridge2511_qwen3_30b_a3b_16xh100.json"])
        # every B200 MoE run is over-predicted (the one fitted run aside): the error is one-sided there
        b200 = [r for n, r in self.ratios.items() if self.script.held_out(n)
                and self.runs[n][0]["device"]["name"].startswith("B200")
                and self.script.model_kind(self.runs[n][0]) == "mixture-of-experts"]
        self.assertEqual(len(b200), 6)
        self.assertGreater(min(b200), 1.05)
        # The host's time is the fitted default on every MoE run but where the recipe captures each
        # layer whole in a CUDA graph (host_layer_ms 0, and the comment says why): no run has a host
        # time of its own.
        for n, (sc, _) in self.runs.items():
            if self.script.model_kind(sc) != "mixture-of-experts":
                continue
            host = sc["model"]["moe"].get("host_layer_ms")
            graphed = "captures each transformer layer whole" in sc["comment"]
            self.assertEqual(host, 0.0 if graphed else None, n)
            if graphed:
                self.assertTrue(sc["model"]["moe"].get("pad_to_capacity"), n)
        every = sorted(self.held_out() + moe)
        self.assertLess(abs(statistics.median(every) - 1), 0.15)  # the median target, over all 32

    def test_the_megatron_lm_runs_are_their_tests_arguments(self):
        # The four files from Megatron-LM's regression tests are what `pipeswap scenario --megatron`
        # reads from the tests' own arguments (examples/calibration/megatron_args/), with the GPU count
        # and the tokenizer's vocabulary the arguments leave out: nothing in them was set by hand.
        cases = {"mixtral_8x7b_tp1pp4ep8vpp8_release": ("heldout_mcore_mixtral_8x7b_64xh100.json", 64, 32000),
                 "mixtral_8x22b_tp2pp8ep8vpp1_release": ("heldout_mcore_mixtral_8x22b_128xh100.json", 128, 32000),
                 "gpt3_7b_tp1_pp4_memory_speed": ("heldout_mcore_gpt_7b_8xh100_pp4_memory.json", 8, 131073),
                 "gpt3_7b_tp4_pp1_memory_speed": ("heldout_mcore_gpt_7b_8xh100_tp4_memory.json", 8, 131073)}
        for args, (name, gpus, vocab) in cases.items():
            _, out, err = run("scenario", "--megatron", os.path.join(CALIBRATION, "megatron_args", args + ".yaml"),
                              "--gpus", str(gpus), "--vocab", str(vocab), "--device", "H100 SXM", check=0)
            got = json.loads(out)
            want = json.loads(run("scenario", "--scenario", os.path.join(CALIBRATION, name), check=0)[1])
            for section in ("model", "parallel", "pipeline", "node"):
                for key, value in want[section].items():
                    if key != "name":
                        self.assertEqual(got[section][key], value, f"{name}: {section}.{key}")
            want["device"]["reserved_bytes"] = got["device"]["reserved_bytes"]  # the files compare allocated bytes
            self.assertEqual(got["device"], want["device"], name)
            self.assertIn("pipeswap scenario: note: not read by the simulator: ", err, name)

    def test_fsdp_peaks_against_torchtitan_s(self):
        # docs/simulator.md ("Calibration", memory): with parallel.fsdp, PyTorch's cross entropy
        # (model.loss "pytorch") and, with tensor parallelism, DTensor's saved gathered inputs
        # (parallel.save_gathered_inputs), every torchtitan run comes within 10 % of its published
        # peak (the memory target).
        ratios = {}
        for n, (sc, none) in self.runs.items():
            if self.script.stack(n) == "torchtitan":
                self.assertTrue(sc["parallel"]["fsdp"], n)
                self.assertEqual(sc["model"]["loss"], "pytorch", n)
                self.assertEqual(sc["parallel"].get("save_gathered_inputs", False), sc["parallel"]["tp"] > 1, n)
                ratios[n] = self.script.simulated_peak_gib(sc, none) / self.script.published_peak_gib(sc["comment"])[0]
        self.assertEqual(len(ratios), 10)
        for n, r in ratios.items():
            self.assertGreater(r, 0.90, n)
            self.assertLess(r, 1.10, n)

    def test_the_stated_error_is_the_held_out_runs_extremes(self):
        # simulate and plan print this band beside every step time (sim/accuracy.hpp), the band of the
        # scenario's kind of model: it must be what those held-out runs give, rounded to two places,
        # not a figure that drifts from them.
        self.assertEqual(sorted(self.stated, key=str), [("dense", None), ("mixture-of-experts", "B200"),
                                                        ("mixture-of-experts", None)])
        for (kind, device), e in self.stated.items():
            held = sorted(r for n, r in self.ratios.items() if self.script.held_out(n)
                          and self.script.model_kind(self.runs[n][0]) == kind
                          and (device is None or self.runs[n][0]["device"]["name"] == device))
            self.assertEqual(e["held_out_runs"], len(held), kind)
            self.assertAlmostEqual(e["throughput_low"], held[0], delta=0.005, msg=kind)
            self.assertAlmostEqual(e["throughput_high"], held[-1], delta=0.005, msg=kind)
            self.assertAlmostEqual(e["step_time_error"],
                                   max(1 / e["throughput_low"] - 1, 1 - 1 / e["throughput_high"]), msg=kind)
        # no memory note: the runs agree with the simulated peaks (test_megatron_peaks_against_its_logs,
        # test_the_bridge_runs_fit_the_devices_they_ran_on)
        for e in self.stated.values():
            self.assertIsNone(e["memory"])

    def test_megatron_peaks_against_its_logs(self):
        # docs/simulator.md ("Calibration", memory): Megatron logs PyTorch's peak allocated bytes on
        # the last pipeline rank; its regression tests record it on H100s. The simulated last ranks
        # (device.reserved_bytes 0) of its two Mixtral runs and its two dense GPT runs (memory only)
        # come within 10 % of it.
        last = {}
        for n, (sc, none) in self.runs.items():
            published, last_rank = self.script.published_peak_gib(sc["comment"])
            if last_rank:
                self.assertTrue(self.script.held_out(n), n)
                self.assertEqual(sc["device"]["reserved_bytes"], 0, n)
                last[n] = self.script.simulated_peak_gib(sc, none) / published
        self.assertEqual(sorted(last), ["heldout_mcore_gpt_7b_8xh100_pp4_memory.json",
                                        "heldout_mcore_gpt_7b_8xh100_tp4_memory.json",
                                        "heldout_mcore_mixtral_8x22b_128xh100.json",
                                        "heldout_mcore_mixtral_8x7b_64xh100.json"])
        for n, r in last.items():
            self.assertGreater(r, 0.90, n)
            self.assertLess(r, 1.10, n)

    def test_the_bridge_runs_fit_the_devices_they_ran_on(self):
        # The Megatron-Bridge runs publish no peak, but ran on 80 GB H100s and 180 GB B200s without
        # recomputation: the model must fit each (its peak, the 6 GB reserve included).
        bridge = [n for n in self.runs if n.removeprefix("heldout_").startswith("bridge")]
        self.assertEqual(len(bridge), 16)
        self.assertEqual(sum(self.script.model_kind(self.runs[n][0]) == "mixture-of-experts" for n in bridge), 13)
        for n in bridge:
            sc, none = self.runs[n]
            self.assertEqual(sc["model"]["recompute"], "none", n)
            memory = 80_000_000_000 if sc["device"]["name"].startswith("H100") else 180_000_000_000
            self.assertEqual(sc["device"]["memory_bytes"], memory, n)
            self.assertTrue(none["fits"], n)
            self.assertLessEqual(none["peak_bytes"], memory, n)

    def test_a_peak_lower_by_less_than_the_resolution_does_not_change_a_setting(self):
        # The B200 calibration scenario: selective recomputation is as fast (the host bounds every
        # layer) and peaks about 25 MB lower than the scenario's own "none". Within the planner's peak
        # resolution (0.05 GB) the plan keeps the scenario's settings; with a resolution of 0 bytes
        # (the tie-break by exact peak) it would take the recomputation.
        _, out, _ = run("plan", "--scenario", os.path.join(CALIBRATION, "bridge2602_qwen3_30b_a3b_8xb200.json"),
                        "--json")
        j = json.loads(out)
        self.assertEqual(j["peak_resolution_bytes"], 50_000_000)
        self.assertEqual(j["chosen"].get("changes", []), [])
        selective = next(e for e in j["simulated"]
                         if e["description"] == "distributed optimizer + selective recomputation")
        self.assertLess(selective["outcome"]["peak_bytes"], j["chosen"]["outcome"]["peak_bytes"])
        self.assertLess(j["chosen"]["outcome"]["peak_bytes"] - selective["outcome"]["peak_bytes"], 50_000_000)
        self.assertIn("changes more of your settings", selective["verdict"])
        self.assertEqual(j["verdict"]["choice"], "none")
        self.assertEqual({a["key"]: a["changes"] for a in j["alternatives"]}["recompute_full"], 1)

    def test_the_reports_print_the_error_beside_the_step_time(self):
        _, out, _ = run("simulate", "--trace", "", "--svg", "")
        self.assertRegex(out.splitlines()[2], r"^model error: on 17 published dense runs held out of the fit, "
                                              r"predicted tokens/s 0\.86-1\.37x the published: a step time may be "
                                              r"off by up to 27 %")
        _, out, _ = run("plan", "--scenario", os.path.join(GALLERY, "7b_2ranks.json"))
        self.assertIn("\nmodel error: on 17 published dense runs", out)
        _, out, _ = run("simulate", "--scenario", os.path.join(GALLERY, "qwen3_30b_a3b_16xh100.json"), "--trace", "",
                        "--svg", "")
        self.assertIn("\nmodel error: on 15 published mixture-of-experts runs held out of the fit, predicted tokens/s "
                      "0.97-2.09x the published: a step time may be off by up to 52 %", out)
        self.assertNotIn("model memory", out)  # the runs agree with the simulated peaks
        self.assertNotIn("model memory", run("simulate", "--trace", "", "--svg", "")[1])
        # that MoE scenario's layers are the device's (BF16, two sequences per micro-batch): no host
        # line; the B200 calibration run's are the host's, and simulate and plan say so
        self.assertNotIn("\nhost: ", out)
        b200 = os.path.join(CALIBRATION, "bridge2602_qwen3_30b_a3b_8xb200.json")
        host = ("\nhost: the host issues each MoE layer's kernels in 8.8 ms (forward and "
                "backward, per micro-batch), the device runs them in 2.4 ms: the layers run at the host's pace")
        self.assertIn(host, run("simulate", "--scenario", b200, "--trace", "", "--svg", "")[1])
        self.assertIn(host, run("plan", "--scenario", b200)[1])
        # on the B200 preset a MoE scenario gets the B200 runs' band, every one of them over-predicted
        b200_error = ("\nmodel error: on 6 published mixture-of-experts runs on B200s held out of the fit, predicted "
                      "tokens/s 1.09-1.82x the published: a step time may be off by up to 45 %")
        self.assertIn(b200_error, run("simulate", "--scenario", b200, "--trace", "", "--svg", "")[1])
        self.assertIn(b200_error, run("plan", "--scenario", b200)[1])
        pace = json.loads(run("simulate", "--scenario", b200, "--json", "--trace", "", "--svg", "")[1])["moe_pace"]
        self.assertEqual(pace["host_layer_ms"], 8.8)
        self.assertTrue(pace["host_bound"])
        self.assertLess(pace["device_layer_ms"], 8.8)
        self.assertIsNone(json.loads(run("simulate", "--json", "--trace", "", "--svg", "")[1])["moe_pace"])
        # the one-efficiency model has no measured error, and says so
        flops = json.dumps({"device": {"compute": "flops"}})
        _, out, _ = run("simulate", "--scenario", "-", "--trace", "", "--svg", "", stdin=flops)
        self.assertIn('\nmodel error: not measured for device.compute "flops"', out)


if __name__ == "__main__":
    PIPESWAP = os.path.abspath(sys.argv[1])
    unittest.main(argv=[sys.argv[0], *sys.argv[2:]], verbosity=2)
