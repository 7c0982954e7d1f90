postgres "data" "pg" {
  database   = "app"
  user       = "app"
  extensions = ["vector"]
  pg_config  = { max_connections = "200" }
  port       = 5433

  plugin {
    version = "1.0"
  }
}

redis "data" "cache" {
  replicas = 1
}
