"""The NVIDIA driver: RM/UVM ioctls, GPFIFO channels, pushbuffer methods and QMDs (see driver.py)."""
