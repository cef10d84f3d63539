"""INT8 calibration: datasets, activation statistics and explicit Q/DQ insertion that TensorRT fuses."""
