# Turns a text file into a C++ source defining `extern const char NAME[]` (NUL-terminated) and
# `extern const unsigned long NAME##Size`, in namespace NAMESPACE: how the live page
# (graph/observe/live_page.html) becomes part of the program.
#   cmake -DIN=file -DOUT=file.cpp -DNAME=kName -DNAMESPACE=ns -P embed_text.cmake
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR size "${hex_length} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," bytes "${hex}")
string(REGEX REPLACE "(('[^']*',){16})" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}.tmp"
  "// Generated from ${IN} by cmake/embed_text.cmake: do not edit.\n"
  "namespace ${NAMESPACE} {\n"
  "extern const char ${NAME}[];\nextern const unsigned long ${NAME}Size;\n"
  "const char ${NAME}[] = {\n${bytes}'\\0'};\n"
  "const unsigned long ${NAME}Size = ${size};\n"
  "}\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
