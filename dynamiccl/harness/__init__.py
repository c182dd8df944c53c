"""The harness: the simulator, the test bed and the evaluations. It may import every product layer; no
product module imports it."""
