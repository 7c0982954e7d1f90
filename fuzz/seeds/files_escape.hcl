asset "sec" "files" {
  a = file("escape")
  b = file("abs")
  c = file("loop")
  d = file("../../outside")
  e = file("/etc/passwd")
  f = file("big.txt")
  g = file("link.env")
  h = file("../shared/common.env")
  i = file("conf/binary.bin")
  j = file("missing.txt")
  k = file("conf")
}
