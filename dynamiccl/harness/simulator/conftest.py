# dynamiccl/harness/simulator/cost_model.py and dynamiccl/harness/simulator/topology.py are aliases of dynamiccl.nccl_model's modules (they replace
# themselves in sys.modules); their doctests run from dynamiccl/nccl_model/, and collecting the aliases by path
# would be a second, mismatching import of the same module.
collect_ignore = ["cost_model.py", "topology.py"]
