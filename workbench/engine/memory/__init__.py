"""Memory figures: host (psutil) and GPU (behind the device seam), sampled off the training thread."""
