deployment "shop" "web" {
  image = "a"
}
#----
# second file: same key, another image; and the same asset twice
deployment "shop" "web" {
  image = "b"
}
asset "shop" "x" {
  k = "v"
}
