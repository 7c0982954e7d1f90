job "ops" "backup" {
  image   = "alpine"
  command = ["sh", "-c", "echo backup"]
  timeout = "1h30m"
  successful_history_limit = 3
  failed_history_limit     = "1"
}

cronjob "ops" "nightly" {
  schedule           = "0 3 * * *"
  timezone           = "Europe/Lisbon"
  suspend            = "false"
  concurrency_policy = "Forbid"
  image              = "alpine"
  command            = ["true"]
}
