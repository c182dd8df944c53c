"""Names shared by the dashboard generator and the Grafana client (no SDK import needed)."""
FOLDER_UID = "dynamiccl"
FOLDER_TITLE = "DynamICCL"
REGIME_TAG = "regime-change"        # tag of regime-change annotations pushed through the Grafana API
