"""`make chaos`: a fault-injection suite that runs a real Stint cluster on several hosts and checks its promises."""
