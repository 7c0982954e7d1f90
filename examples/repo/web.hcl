# A small web deployment on the locally built busybox image (scripts/docker-setup builds it).
# Edit, commit, and the agent rolls it out; `voodu-agent status` shows the rollout.
deployment "demo" "web" {
  image    = "voodu-busybox:latest"
  command  = ["httpd", "-f", "-v", "-p", "8080", "-h", "/www"]
  replicas = 2
  ports    = ["8080"]

  env = {
    GREETING = "hello from voodu-agent"
  }
}
