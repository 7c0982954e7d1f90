deployment "s" "n" {
  image = "ÿþ"
}
