/* decoder/_slots.h: where each named slot of a slotted class sits in its instances.

The compiled modules build frozen slotted dataclasses (TcpSegment, Request, Response, the events)
by allocating the instance and storing each field at its slot's offset, as the class's own
__init__ would through object.__setattr__, in a fraction of the time. A frozen dataclass only
forbids __setattr__; its slots are plain member descriptors, whose offsets are read here once.
Included by decoder/_pcapscan.c and decoder/_framecore.c.
*/
#ifndef KWIRE_SLOTS_H
#define KWIRE_SLOTS_H

#include <Python.h>
#include <structmember.h>

/* offsets[i] = the offset of cls's slot names[i], for i < n; -1 with an exception set when cls is
   not a class or a name is not an object slot. */
static int slot_offsets(PyObject *cls, const char **names, int n, Py_ssize_t *offsets) {
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "a class is needed");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        PyObject *d = PyObject_GetAttrString(cls, names[i]);
        if (d == NULL) return -1;
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                 ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
        if (ok) offsets[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s is not a slot", names[i]);
            return -1;
        }
    }
    return 0;
}

#define SLOT(obj, offsets, i) (*(PyObject **)((char *)(obj) + (offsets)[i]))

#endif
