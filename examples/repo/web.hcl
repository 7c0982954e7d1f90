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

# Routed by the agent's ingress proxy (Caddy, one container per agent): with
# scripts/run-example, `curl http://demo.localhost:8088/` (or `-H 'Host: demo.localhost'`
# against 127.0.0.1:8088) reaches one of the ready replicas, on the deployment's port 8080.
ingress "demo" "web" {
  host = "demo.localhost"
}
