# A background worker: a shell loop that logs a line every 30 seconds.
deployment "demo" "worker" {
  image   = "voodu-busybox:latest"
  command = ["sh", "-c", "while true; do echo \"tick $(date)\"; sleep 30; done"]
  restart = "always"
}
